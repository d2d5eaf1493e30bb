"""trnc.runtime: executing isa.Programs on the host. reference.py (numpy) is the executable specification."""
