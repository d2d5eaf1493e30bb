"""Benchmark: the host run of compiled models against eager PyTorch (issue 13), and the load path per instruction.

Per model and precision, compiled once with trnc.compile (precision fp32, or bf16 with auto_cast "all"), and
per thread count T (1 and 2): the time of one call of the CompiledModel (inputs in, outputs out, the JIT run in
between, TRNC_THREADS=T) against one call of the eager model in fp32 with torch.set_num_threads(T), under
torch.no_grad. Rounds alternate the two so both see the same machine load; each figure is the best of R rounds
after a warm-up. Ratio = trnc / eager (lower is faster; the goal is <= 1.0 in fp32 and <= 1.5 in bf16).

Load path, per model: `trnc.runtime.jit.executor.load` of the compiled program with its kernels already in
the cache, with the verifier (`verified=False`, as for a program from a file) and without it (as for the
compiler's own output), in microseconds per instruction (goal: together at most 3 us on a 100k-instruction
program). `--load-at-scale` adds that program: BERT-large (24 layers, hidden 1024) at seq 512, 95k
instructions, compiled once (about 75 s) for the load figures only.

Floor, per model and precision: the host profile of one serial run (`CompiledModel.host_profile`), the sum of
each step's time run again at once (its data in cache), against the one-thread eager time: a run of the program
one instruction at a time takes at least that long, so a ratio above 1.0 puts 1.0x out of that run's reach.

Models (random weights, no downloads): GPT-2 (4 layers, hidden 512, 8 heads, seq 256), BERT-base (12 layers,
seq 128), a Llama-style decoder (one layer, hidden 1024, 16 heads of which 4 key-value, MLP 2816, seq 256),
torchvision's ResNet-50 at 1x3x224x224.

Run: python benchmarks/bench_host.py [--quick] [--models gpt2,bert,llama,resnet50] [--rounds R] [--load-at-scale]
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import time

import torch

from trnc.bench.vision import torchvision  # noqa: E402

torchvision()   # transformers imports torchvision, which needs the shim beside torch's CPU build
import trnc  # noqa: E402
from trnc import flags  # noqa: E402
from trnc.isa.ap import AP  # noqa: E402
from trnc.isa.program import Instruction, Program  # noqa: E402
from trnc.runtime.jit import executor  # noqa: E402

THREADS = (1, 2)


def gpt2():
    from transformers import GPT2Config, GPT2Model
    config = GPT2Config(n_layer=4, n_embd=512, n_head=8, n_positions=256, vocab_size=8192, use_cache=False,
                        bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return GPT2Model(config).eval(), (torch.randint(0, 8192, (1, 256)),)


def bert():
    from transformers import BertConfig, BertModel
    return BertModel(BertConfig(attn_implementation="sdpa")).eval(), (torch.ones(1, 128, dtype=torch.long),)


def llama():
    from transformers import LlamaConfig, LlamaModel
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=1, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=8192, max_position_embeddings=512, use_cache=False,
                         attn_implementation="sdpa")
    return LlamaModel(config).eval(), (torch.randint(0, 8192, (1, 256)),)


def resnet50():
    return torchvision().models.resnet50(weights=None).eval(), (torch.randn(1, 3, 224, 224),)


def bert_large():
    from transformers import BertConfig, BertModel
    config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                        attn_implementation="sdpa")
    return BertModel(config).eval(), (torch.ones(1, 512, dtype=torch.long),)


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama, "resnet50": resnet50}
PRECISIONS = {"fp32": {"precision": "fp32"}, "bf16": {"precision": "bf16", "auto_cast": "all"}}


def best_of(rounds: int, *calls) -> list[float]:
    """The best time of each call over `rounds` alternating rounds, after one warm-up round."""
    best = [float("inf")] * len(calls)
    for r in range(rounds + 1):
        for k, call in enumerate(calls):
            start = time.perf_counter()
            call()
            if r:
                best[k] = min(best[k], time.perf_counter() - start)
    return best


def bench_model(name: str, rounds: int) -> list[str]:
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    rows = []
    for precision, options in PRECISIONS.items():
        with torch.no_grad():
            compiled = trnc.compile(model, inputs, **options)
        program = compiled.program
        n = len(program.instructions)
        for threads in THREADS:
            torch.set_num_threads(threads)

            def run_trnc():
                with flags.override(TRNC_THREADS=threads), torch.no_grad():
                    compiled(*inputs)

            def run_eager():
                with torch.no_grad():
                    model(*inputs)

            got, eager = best_of(rounds, run_trnc, run_eager)
            rows.append(f"| {name} | {precision} | {n} | {threads} | {got * 1e3:.1f} | {eager * 1e3:.1f} | "
                        f"{got / eager:.2f}x |")
            if threads == 1:
                rows.append(floor_row(name, precision, compiled, inputs, eager, max(1, rounds // 3)))
        rows.append(load_row(name, precision, program, max(1, rounds // 3)))
    return rows


def floor_row(name: str, precision: str, compiled, inputs, eager: float, rounds: int) -> str:
    """The host profile's floor at one thread (runtime/jit/host_profile.py): the sum of every step's time run
    again at once, its data in cache, as the least any run of the program one instruction at a time can take;
    the best of `rounds` profiles, against the eager time of the row above."""
    with torch.no_grad():
        profiles = [compiled.host_profile(*inputs) for _ in range(rounds)]
    again = min(p.again_total for p in profiles)
    reached = min(p.total for p in profiles)
    return (f"| {name} | {precision} | {len(compiled.program.instructions)} | floor | steps again {again * 1e3:.1f} "
            f"ms | steps as reached {reached * 1e3:.1f} ms | again / eager {again / eager:.2f}x |")


def load_row(name: str, precision: str, program, rounds: int) -> str:
    """Each load gets a new Program of the same instructions, so none reuses the operand table (isa/
    operand_table.py) that another built and kept with its program. The instructions carry their rows, packed
    when they were made (isa/rows.py): `make` is the time to make every instruction and AP again by its
    constructor, rows included, as the compiler's scheduler and the decoder pay it."""
    n = len(program.instructions)

    def fresh() -> Program:
        return Program(program.tensors, program.instructions, program.target)

    def make() -> list[Instruction]:
        return [Instruction(i.opcode, i.engine, tuple((k, dataclasses.replace(v) if isinstance(v, AP) else v)
                                                      for k, v in i.args), i.queue, i.waits, i.signals)
                for i in program.instructions]

    verify_load, load, made = best_of(rounds, lambda: executor.load(fresh()),
                                      lambda: executor.load(fresh(), verified=True), make)
    return (f"| {name} | {precision} | {n} | load | verify + load {verify_load / n * 1e6:.1f} us/instr | "
            f"load {load / n * 1e6:.1f} us/instr | make {made / n * 1e6:.1f} us/instr |")


def load_at_scale(rounds: int) -> str:
    torch.manual_seed(0)
    model, inputs = bert_large()
    with torch.no_grad():
        program = trnc.compile(model, inputs, precision="fp32").program
    return load_row("bert-large seq 512", "fp32", program, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="GPT-2 only, 3 rounds")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--load-at-scale", action="store_true", help="the load path on a 95k-instruction program")
    args = parser.parse_args()
    names = ["gpt2"] if args.quick else [m for m in args.models.split(",") if m]
    rounds = 3 if args.quick else args.rounds
    print(f"{datetime.date.today()} {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch threads by default, best of {rounds} rounds")
    print("| model | precision | instructions | threads | trnc ms | eager fp32 ms | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in names:
        for row in bench_model(name, rounds):
            print(row, flush=True)
    if args.load_at_scale:
        print(load_at_scale(max(1, rounds // 3)), flush=True)   # best of as many loads as the models' figures


if __name__ == "__main__":
    main()
