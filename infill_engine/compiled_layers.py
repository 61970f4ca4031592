"""The embedded model's layers over a denoising step's canvas rows, and over a context's rows, compiled ahead of time
for this CPU (issue 12).

A denoising step runs six small transformer blocks over a few canvas positions (13 on average for a single line):
per layer two RMSNorms, the rotary, views, attention over the plan's keys/values buffer and three matrix products,
each a separate PyTorch operator with its Python and dispatch overhead. `torch.export` traces the blocks once into
one graph (batch, rows and buffer length dynamic) and AOTInductor compiles it to a shared library with the weights
frozen in (`torch._inductor.aoti_compile_and_package`): one call per step instead of about 150 operators. A second
graph runs the same blocks over a causal context's rows, each attending to the buffer up to its own position: a new
request's context, or the part after a cached head (a keystroke's). A mixed model's products (`mixed_precision.py`)
run inductor's AMX micro-kernels on a CPU with AMX, oneDNN's bfloat16 products on one with AVX-512 BF16 alone.

Compiling takes 30-60 s of one core, so it never runs inside a fill: `compile_layers` writes a package file (a zip of
the two libraries, atomically) into a cache directory, keyed by what the libraries depend on (the weights' digest,
the model's config less its sampler settings, the PyTorch version, the CPU and the package's format); `load_compiled_layers` loads one in
0.04-0.2 s and runs its libraries with the GIL released, and packages no server has loaded for a month are removed.
`CompiledLayers` runs the package only where it gives the eager blocks' numbers (float32 or mixed on the CPU, no
attention mask from padding, the weights it was compiled from unchanged, shapes within the exported range); anywhere
else the model runs its blocks eagerly.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import platform
import weakref
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

logger = logging.getLogger(__name__)

MAX_BATCH = 16  # canvas rows (candidates, batched requests) one compiled call takes
MAX_ROWS = 512  # canvas positions per row
MAX_LENGTH = 4096  # context + canvas positions of the keys/values buffers
PACKAGE_FORMAT = 2  # in the package's key: 2 holds the step's and the context's libraries (1: the step's only)
UNUSED_DAYS = 30  # a package no server has loaded for this long is removed when another is loaded or compiled
STAGING_HOURS = 1  # a compile's staging file this old whose process is gone (here) is removed with them
GRAPHS = ("step", "context")  # the package's libraries, each a member `NAME.so` of its zip file

_registrations = [0]  # parameters and modules registered on any module of this process so far (`_count_registration`)


def _count_registration(*_: Any) -> None:
    """A global registration hook: a parameter or submodule was set somewhere (it may replace a compiled one)."""
    _registrations[0] += 1


nn.modules.module.register_module_parameter_registration_hook(_count_registration)
nn.modules.module.register_module_module_registration_hook(_count_registration)


class _Layers(nn.Module):
    """The model's blocks over rows against per-layer keys/values buffers, as a function of tensors only: a step's
    canvas rows attend to the whole buffer; a context's rows (`causal`) to the buffer's positions up to their own."""

    def __init__(self, model: nn.Module, causal: bool = False):
        super().__init__()
        from infill_engine.packed_weights import unpack_linear_weights

        self.layers = copy.deepcopy(model.layers)  # traced plain: MKL's packed layout is opaque to the export
        unpack_linear_weights(self.layers)
        self.causal = causal

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Hidden states (B, r, E) after every block; the rows' keys and values written into the buffers at `slots`."""
        mask = None
        if self.causal:  # (r, L): row i sees the buffer up to its own position slots[i]
            mask = torch.arange(keys[0].shape[2], device=x.device)[None, :] <= slots[:, None]
        for block, layer_keys, layer_values in zip(self.layers, keys, values):
            x, _, _ = block(x, cos, sin, mask, (layer_keys, layer_values), slots)
        return x


def compile_refusal(model: nn.Module) -> str | None:
    """Why this model's layers are not compiled ahead of time (a phrase for `diffill doctor`); None: they can be."""
    if getattr(getattr(model, "config", None), "model_type", None) != "diffill":
        return "only the diffill family's layers are compiled"
    weight = model.embed_tokens.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return f"compiled layers need float32 weights on the CPU (these are {str(weight.dtype).removeprefix('torch.')} " \
               f"on {weight.device.type})"
    if not hasattr(torch._inductor, "aoti_compile_and_package"):
        return f"this PyTorch ({torch.__version__}) has no AOTInductor packaging"
    return None


def _weights_digest(model: nn.Module) -> str:
    """A digest of the layers' weights (what the package freezes in)."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(model.layers.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _cpu_name() -> str:
    """What identifies this CPU's instruction set for compiled code."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return hashlib.blake2b(line.encode(), digest_size=8).hexdigest()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_key(model: nn.Module) -> str:
    """The package's file name for this model, PyTorch and CPU."""
    # not where it was read, nor the sampler settings the checkpoint recommends: the layers do not depend on them
    settings = {k: v for k, v in model.config.to_dict().items() if k not in ("_name_or_path", "diffill_sampler")}
    config = json.dumps(settings, sort_keys=True, default=str)
    digest = hashlib.blake2b(digest_size=12)
    for part in (_weights_digest(model), config, torch.__version__, _cpu_name(), platform.machine(),
                 str(PACKAGE_FORMAT)):
        digest.update(part.encode())
    return f"layers-{digest.hexdigest()}.pt2"


def default_cache_dir() -> Path:
    """Where compiled packages live: $DIFFILL_CACHE or ~/.cache/diffill, then `compiled-layers`."""
    root = os.environ.get("DIFFILL_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                           os.path.expanduser("~/.cache"), "diffill")
    return Path(root) / "compiled-layers"


def _example(model: nn.Module) -> tuple[Any, ...]:
    """Example inputs for the export: batch 2 and 3 rows, so that neither is specialised to 1 (the rows at the
    buffer's end: a context's rows after 5 cached positions)."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    head_dim = config.hidden_size // heads
    batch, rows, length = 2, 3, 8
    x = torch.randn(batch, rows, config.hidden_size)
    cos, sin = torch.randn(batch, rows, 1, head_dim), torch.randn(batch, rows, 1, head_dim)
    slots = torch.arange(length - rows, length)
    keys = tuple(torch.randn(batch, kv_heads, length, head_dim) for _ in model.layers)
    values = tuple(torch.randn(batch, kv_heads, length, head_dim) for _ in model.layers)
    return x, cos, sin, slots, keys, values


@torch.no_grad()
def compile_layers(model: nn.Module, cache_dir: Path | None = None) -> Path:
    """Export and compile the model's blocks for this CPU into the cache (30-60 s), a step's and a context's; the
    package's path."""
    import torch._inductor.config as inductor_config
    from torch.export import Dim

    refusal = compile_refusal(model)
    if refusal is not None:
        raise ValueError(f"cannot compile this model's layers: {refusal}")
    cache_dir = cache_dir or default_cache_dir()
    target = cache_dir / package_key(model)
    if target.exists():
        try:
            _open_package(model, target)
            return target
        except Exception as error:  # damaged (a full disk, a foreign file): compiled again over it
            logger.warning("%s does not load (%s); compiling it again", target, error)
    cache_dir.mkdir(parents=True, exist_ok=True)
    batch, rows = Dim("batch", min=1, max=MAX_BATCH), Dim("rows", min=1, max=MAX_ROWS)
    length = Dim("length", min=2, max=MAX_LENGTH)
    buffers = tuple({0: batch, 2: length} for _ in model.layers)
    dynamic = ({0: batch, 1: rows}, {0: batch, 1: rows}, {0: batch, 1: rows}, {0: rows}, buffers, buffers)
    staging = cache_dir / f".{os.getpid()}.{target.name}"
    parts = {name: cache_dir / f".{os.getpid()}.{name}.{target.name}" for name in GRAPHS}  # each must end in .pt2
    try:
        for name, part in parts.items():
            exported = torch.export.export(_Layers(model, causal=name == "context").eval(), _example(model),
                                           dynamic_shapes=dynamic, strict=False)
            with inductor_config.patch(_inductor_options(model)):
                torch._inductor.aoti_compile_and_package(exported, package_path=str(part))
        with zipfile.ZipFile(staging, "w") as package:
            for name, part in parts.items():
                package.writestr(f"{name}.so", _library_of(part))
        os.replace(staging, target)  # whole or not at all: a reader never sees a half-written package
    finally:
        for path in (staging, *parts.values()):
            path.unlink(missing_ok=True)
    prune_cache(cache_dir, keep=target)
    return target


def _library_of(package: Path) -> bytes:
    """The compiled library in one of AOTInductor's packages (the weights are frozen into it)."""
    with zipfile.ZipFile(package) as archive:
        names = [name for name in archive.namelist() if name.endswith(".so")]
        if len(names) != 1:
            raise ValueError(f"expected one compiled library in {package.name}, found {len(names)}")
        return archive.read(names[0])


def _inductor_options(model: nn.Module) -> dict[str, Any]:
    """How inductor compiles these layers. Freezing: the weights become constants, laid out for inductor's kernels.
    One thread in the generated kernels (the norms, rotary and adds over a few rows), whatever this process has:
    otherwise the count is baked into the library; torch's own matrix products and attention use the process's
    threads. Mixed precision on a CPU with AMX: the products run inductor's own AMX micro-kernels on weights packed
    for them (the CPP GEMM template; 0.90 ms for the embedded model's blocks over 13 rows against 1.88 through
    oneDNN's bfloat16 products and 2.59 in float32), without autotuning against torch's (a compile that does not
    depend on the machine's load). Without AMX (AVX-512 BF16 alone, Zen 4) the template is slower than oneDNN's
    products (3.87 ms against 1.82 over 13 rows, measured), so they stay oneDNN's."""
    from infill_engine.device import cpu_has_amx
    from infill_engine.mixed_precision import is_mixed

    options: dict[str, Any] = {"freezing": True, "cpp.threads": 1}
    if is_mixed(model.layers) and cpu_has_amx():
        options.update({"max_autotune": True, "max_autotune_gemm_backends": "CPP"})
    return options


class CompiledLayers:
    """A loaded package of a model's blocks, run where it gives the eager blocks' numbers: `__call__` for a denoising
    step's canvas rows, `context` for context rows encoded after the ones before them."""

    def __init__(self, runner: Any, model: nn.Module, path: Path, context_runner: Any = None):
        self.runner = runner
        self.context_runner = context_runner
        self.path = path
        self.layers = model.layers
        self.parameters = list(model.layers.parameters())  # walked again only after a registration anywhere
        self.registrations = _registrations[0]
        self.weights = self.weight_versions()
        self.calls = 0  # steps run compiled
        self.context_calls = 0  # context encodes run compiled

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        """A copied model runs its blocks eagerly (its weights may be changed after the copy)."""
        return None

    def accepts(self, x: torch.Tensor, attn_mask: torch.Tensor | None, keys: tuple[torch.Tensor, ...]) -> bool:
        """Whether this call can run compiled: float32 CPU inference, unmasked, in range, the same weights, and no
        dispatch mode watching the operators (FLOP counting, fake tensors, tracing: they see the eager ones)."""
        if attn_mask is not None or torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
            return False
        if _get_current_dispatch_mode() is not None:
            return False
        batch, rows, _ = x.shape
        if not (1 <= batch <= MAX_BATCH and 1 <= rows <= MAX_ROWS and keys[0].shape[2] <= MAX_LENGTH):
            return False
        if any(k.shape[0] != batch or not k.is_contiguous() for k in keys):
            return False
        return self.weight_versions() == self.weights

    def weight_versions(self) -> list[tuple[int, int]]:
        """Where each of the layers' parameters lives and its version (changed in place, its version moves): the
        parameters are walked again only after a parameter or submodule was set on some module, as a replaced one
        would be (walking them took 2.5 % of a single-line step)."""
        if self.registrations != _registrations[0]:
            self.parameters, self.registrations = list(self.layers.parameters()), _registrations[0]
        return [(p.data_ptr(), p._version) for p in self.parameters]

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                 keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Hidden states (B, r, E) after every block, the rows' keys and values written into the buffers."""
        self.calls += 1
        return self.runner(x.contiguous(), cos.contiguous(), sin.contiguous(), slots.contiguous(), *keys, *values)

    def context(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Hidden states (B, r, E) of context rows after every block, each row attending to the buffers' positions up
        to its own (`slots`, ascending), the rows' keys and values written into the buffers there."""
        self.context_calls += 1
        return self.context_runner(x.contiguous(), cos.contiguous(), sin.contiguous(), slots.contiguous(), *keys,
                                   *values)


class _Library:
    """The package's compiled library, run through its C interface with the GIL released (ctypes), so that a
    server's other threads (its event loop, cancellations) run during a step; `aoti_load_package`'s runner holds the
    GIL for the whole call (3 ms late on a 1 ms timer, measured)."""

    def __init__(self, path: Path, member: str):
        import ctypes
        import tempfile

        with zipfile.ZipFile(path) as package:
            if member not in package.namelist():
                raise ValueError(f"the package has no {member} (it holds {', '.join(package.namelist()) or 'nothing'})")
            folder = tempfile.mkdtemp(prefix="diffill-layers-")
            library = os.path.join(folder, "layers.so")
            try:
                with package.open(member) as source, open(library, "wb") as target:
                    target.write(source.read())
                self.library = ctypes.CDLL(library)
            finally:
                Path(library).unlink(missing_ok=True)  # mapped once loaded
                os.rmdir(folder)
        # Linux lets a process use AMX tiles only once it has asked (arch_prctl); torch's own kernels ask before their
        # first tile instruction, a library's AMX micro-kernels do not (without this: SIGILL, measured).
        init_amx = getattr(torch._C._cpu, "_init_amx", None)
        if init_amx is not None:
            init_amx()
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        self.handle = pointer()
        create = self.library.AOTInductorModelContainerCreateWithDevice
        create.argtypes = [ctypes.POINTER(pointer), size, ctypes.c_char_p, ctypes.c_char_p]
        self._check(create(ctypes.byref(self.handle), 1, b"cpu", None), "create")
        weakref.finalize(self, self.library.AOTInductorModelContainerDelete, self.handle)
        self.run = self.library.AOTInductorModelContainerRun
        self.run.argtypes = [pointer, ctypes.POINTER(pointer), size, ctypes.POINTER(pointer), size, pointer, pointer]
        self.inputs, self.outputs = size(), size()
        self.library.AOTInductorModelContainerGetNumInputs(self.handle, ctypes.byref(self.inputs))
        self.library.AOTInductorModelContainerGetNumOutputs(self.handle, ctypes.byref(self.outputs))
        self.capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        self.capsule_pointer.restype, self.capsule_pointer.argtypes = pointer, [ctypes.py_object, ctypes.c_char_p]
        self.capsule = ctypes.pythonapi.PyCapsule_New
        self.capsule.restype, self.capsule.argtypes = ctypes.py_object, [pointer, ctypes.c_char_p, pointer]

    @staticmethod
    def _check(status: int, what: str) -> None:
        """Raise where the library's call did not succeed."""
        if status != 0:
            raise RuntimeError(f"the compiled layers' {what} failed (status {status})")

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        """The library's one output for these inputs (their handles are the library's to free)."""
        import ctypes

        handles = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(tensors))
        inputs = (ctypes.c_void_p * len(handles))(*(self.capsule_pointer(handle, None) for handle in handles))
        outputs = (ctypes.c_void_p * self.outputs.value)()
        self._check(self.run(self.handle, inputs, len(handles), outputs, self.outputs.value, None, None), "run")
        stolen = [self.capsule(output, None, None) for output in outputs]
        return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(stolen)[0]


def load_compiled_layers(model: nn.Module, cache_dir: Path | None = None) -> CompiledLayers | None:
    """The model's compiled blocks from the cache, if a package for this model, PyTorch and CPU is there."""
    if compile_refusal(model) is not None:
        return None
    path = (cache_dir or default_cache_dir()) / package_key(model)
    if not path.exists():
        return None
    try:
        compiled = _open_package(model, path)
    except Exception as error:  # a package from a damaged or foreign cache: run eagerly
        logger.warning("%s: compiled layers not loaded (%s); the layers run eagerly", path, error)
        return None
    try:
        os.utime(path)  # its last use, which `prune_cache` reads
        prune_cache(path.parent, keep=path)
    except OSError:
        pass  # a read-only cache: nothing is pruned from it
    return compiled


def prune_cache(cache_dir: Path, keep: Path, days: float = UNUSED_DAYS) -> list[Path]:
    """Remove the packages (and their markers and logs) that no server has loaded for `days`, but `keep`, and what a
    compile that died left behind (an hour ago or more: a cache shared between machines sees others' pids as gone);
    the paths removed. Another model's, PyTorch's or format's package is 20-40 MB."""
    import time

    cutoff = time.time() - days * 86400
    removed = []
    for path in cache_dir.glob("layers-*.pt2"):
        if path != keep and _older_than(path, cutoff) and _lock_holder(path.with_suffix(".lock")) is None:
            removed += [p for p in (path, *(path.with_suffix(x) for x in (".failed", ".log", ".lock"))) if _removed(p)]
    for staging in cache_dir.glob(".*.pt2"):  # `.PID.NAME`: a compile's files while it runs
        pid = staging.name.split(".")[1]
        if pid.isdigit() and not _alive(int(pid)) and _older_than(staging, time.time() - STAGING_HOURS * 3600) \
                and _removed(staging):
            removed.append(staging)
    for path in removed:
        logger.info("removed %s from the compiled layers' cache (unused for %d days, or left by a compile that died)",
                    path, days)
    return removed


def _older_than(path: Path, cutoff: float) -> bool:
    """Whether `path` was last written before `cutoff` (a time.time() value); False where it cannot be read."""
    try:
        return path.stat().st_mtime < cutoff
    except OSError:
        return False


def _removed(path: Path) -> bool:
    """Whether `path` was there and is removed now (another user's file in a shared cache stays)."""
    try:
        path.unlink()
    except OSError:  # gone already, or not ours to remove
        return False
    return True


def _open_package(model: nn.Module, path: Path) -> CompiledLayers:
    """The package at `path` loaded for `model`; raises where it does not load or does not take the model's inputs."""
    runners = [_Library(path, f"{name}.so") for name in GRAPHS]
    expected = 4 + 2 * len(model.layers)
    for name, runner in zip(GRAPHS, runners):
        if (runner.inputs.value, runner.outputs.value) != (expected, 1):
            raise ValueError(f"its {name} library takes {runner.inputs.value} inputs and gives {runner.outputs.value} "
                             f"outputs, not {expected} and 1")
    return CompiledLayers(runners[0], model, path, context_runner=runners[1])


def _lock_holder(lock: Path) -> int | None:
    """The pid of a live compile that holds `lock`, else None (no lock, or its process is gone)."""
    try:
        pid = int(lock.read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and _alive(pid) else None


def _alive(pid: int) -> bool:
    """Whether a process with this pid runs (it may be another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _take_lock(lock: Path) -> bool:
    """Create `lock` holding this process's pid; False when a live process holds it (a stale one is taken over)."""
    for _ in range(2):
        try:
            descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _lock_holder(lock) is not None:
                return False
            lock.unlink(missing_ok=True)  # its process is gone
            continue
        with os.fdopen(descriptor, "w") as handle:
            handle.write(str(os.getpid()))
        return True
    return False


class BackgroundCompile:
    """`diffill compile` of a model's layers in a child process at the lowest CPU priority, loaded when it is done.

    One compile per package at a time on a machine (a lock file beside the package names its pid); a compile that
    failed, or whose package does not load, leaves a `.failed` file with the reason, and servers do not try it again
    (`diffill compile` does)."""

    def __init__(self, model: nn.Module, command: list[str], cache_dir: Path | None = None):
        self.model = model
        self.cache_dir = cache_dir or default_cache_dir()
        self.key = package_key(model)
        self.path = self.cache_dir / self.key
        self.process: Any = None
        self.state = "not started"
        self.command = [*command, "--background", "--expect-key", self.key, "--cache-dir", str(self.cache_dir)]

    @property
    def failed_marker(self) -> Path:
        """Where a failed compile's log is kept."""
        return self.path.with_suffix(".failed")

    def start(self) -> bool:
        """Start the child unless a compile of the package runs or failed before; whether one runs now. (Called where
        none loaded: a package already there is damaged, and the child compiles it again.)"""
        import subprocess

        if self.failed_marker.exists():
            self.state = f"failed before (see {self.failed_marker}; `diffill compile` tries again)"
            return False
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_suffix(".lock")
        if not _take_lock(lock):
            self.state = f"being compiled by process {_lock_holder(lock)}"
            return False
        environment = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1"}
        try:
            with open(self.path.with_suffix(".log"), "w") as log:  # the child's output, kept if it fails
                self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                env=environment, start_new_session=True)
        except OSError:
            lock.unlink(missing_ok=True)
            raise
        lock.write_text(str(self.process.pid))
        self.state = f"compiling in process {self.process.pid}"
        logger.info("compiling the model's layers for this CPU in the background (process %d) into %s",
                    self.process.pid, self.path)
        return True

    def poll(self) -> CompiledLayers | None:
        """The compiled layers once the child has written them (None before, and after a failure)."""
        if self.process is None or self.process.poll() is None:
            return None
        status, self.process = self.process.returncode, None
        self.path.with_suffix(".lock").unlink(missing_ok=True)
        log = self.path.with_suffix(".log")
        if status != 0:
            text = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            self.failed_marker.write_text(f"exit status {status}\n{text}")
            self.state = f"failed (exit status {status}; see {self.failed_marker})"
            logger.warning("compiling the model's layers failed (exit status %d); they run eagerly: %s", status,
                           text.strip().splitlines()[-1:] or "")
            return None
        log.unlink(missing_ok=True)
        try:
            compiled = _open_package(self.model, self.path)
        except Exception as error:  # a lasting cause (this process cannot load what it compiles): not tried again
            self.failed_marker.write_text(f"compiled (exit status 0), but the package does not load here: {error}\n")
            self.state = f"compiled, but the package did not load (see {self.failed_marker})"
            logger.warning("the compiled layers do not load (%s); they run eagerly", error)
            return None
        self.state = "loaded"
        return compiled
