"""The process's LLVM code generator: host target machine, optimization pipeline, object code, and loading.

One Codegen per process (`codegen()`), as in numba's CPUCodegen: it initializes the native target
(never `llvm.initialize()`, which llvmlite deprecated and which raises) and builds a target machine for
the host triple, CPU name and features (so the host's vector extensions are used) at opt level 3.
`compile` turns LLVM IR text into object code: verify, the new pass manager's O3 pipeline with loop and
SLP vectorization, verify again, emit. `engine` makes the MCJIT engine of one runtime/jit/library.py
Library, into which object code (fresh or from runtime/jit/cache.py) is loaded.

Bit-exactness: kernels carry no fast-math flags, so LLVM neither reassociates nor contracts a fmul and
fadd into an FMA (the target machine's default FP fusion only fuses explicit fmuladd intrinsics, which
trnc never emits). The one fused operation is explicit: matmul's llvm.fma, which the spec defines;
tests/runtime/test_jit_program.py checks it on values where rounding the product first would differ.
"""
from __future__ import annotations

import ctypes

import llvmlite
import llvmlite.binding as llvm


OPT_LEVEL = 3


def _with_wide_vectors(features: str) -> str:
    """The host's features, plus 512-bit vectors in loops LLVM vectorizes where the host has AVX-512: its
    tuning for Intel AVX-512 CPUs prefers 256 bits (a guard against the clock drops of older Xeons), which left
    the elementwise kernels at half width (exp and tanh ran 1.6 to 2.5x slower than in 512 bits on a 2026 Xeon).
    Part of the kernel cache key through `identity`."""
    return features + ",-prefer-256-bit" if "+avx512f" in features.split(",") else features


class Codegen:
    """Host target machine and O3 pass pipeline; MCJIT engines for the Libraries that load the code."""

    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        llvm.initialize_native_asmparser()   # the parallel driver's spin loop has an inline `pause`
        self.triple = llvm.get_process_triple()
        self.cpu = llvm.get_host_cpu_name()
        self.features = _with_wide_vectors(llvm.get_host_cpu_features().flatten())
        self.target_machine = self._target_machine()
        self.data_layout = str(self.target_machine.target_data)

    def _target_machine(self) -> llvm.TargetMachine:
        # jit=True: the JIT code model, so objects can be relocated anywhere by MCJIT's RuntimeDyld.
        target = llvm.Target.from_triple(self.triple)
        return target.create_target_machine(cpu=self.cpu, features=self.features, opt=OPT_LEVEL, jit=True)

    def engine(self) -> llvm.ExecutionEngine:
        """A new, empty MCJIT engine for the host, with a target machine of its own (the engine owns and frees it)."""
        owner = llvm.parse_assembly("")
        owner.triple = self.triple
        return llvm.create_mcjit_compiler(owner, self._target_machine())

    @property
    def f32_lanes(self) -> int:
        """fp32 lanes of the host's widest vector registers the kernels use: 16 with AVX-512, else 8 (AVX2;
        LLVM splits an 8-lane vector into narrower registers where the host has them)."""
        return 16 if "+avx512f" in self.features.split(",") else 8

    @property
    def identity(self) -> str:
        """What the object code depends on besides the IR: host triple, CPU, features and the LLVM version."""
        version = ".".join(map(str, llvm.llvm_version_info))
        return f"{self.triple}|{self.cpu}|{self.features}|llvm {version}|llvmlite {llvmlite.__version__}"

    def compile(self, ir_text: str) -> bytes:
        """Object code of a module given as LLVM IR text, optimized at O3 for the host."""
        return self.target_machine.emit_object(self.optimize(ir_text))

    def assembly(self, ir_text: str) -> str:
        """Host assembly of a module after the same pipeline (for debugging and tests)."""
        return self.target_machine.emit_assembly(self.optimize(ir_text))

    def optimize(self, ir_text: str) -> llvm.ModuleRef:
        """Parse and verify the IR, run the O3 pipeline with loop and SLP vectorization, and verify again."""
        module = llvm.parse_assembly(ir_text)
        module.triple = self.triple
        module.data_layout = self.data_layout
        module.verify()
        tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
        tuning.loop_vectorization = True
        tuning.slp_vectorization = True
        tuning.loop_unrolling = False
        builder = llvm.create_pass_builder(self.target_machine, tuning)
        builder.getModulePassManager().run(module, builder)
        module.verify()
        return module


_codegen: Codegen | None = None


def codegen() -> Codegen:
    """The process's Codegen, created on first use."""
    global _codegen
    if _codegen is None:
        _codegen = Codegen()
    return _codegen


def cfunc(address: int, restype, *argtypes):
    """A ctypes function for a native address (built once by the caller, then called cheaply)."""
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)
