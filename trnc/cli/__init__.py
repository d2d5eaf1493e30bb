"""The `trnc` command line: a thin layer over the library (parser, then a drive() per subcommand)."""
