#!/usr/bin/env python3
"""Check `sextant export --to megatron-lm` output against Megatron-LM's own validation.

Usage:
    python3 tools/megatron_args_check.py MEGATRON_LM_DIR FILE [FILE ...]

MEGATRON_LM_DIR is a Megatron-LM checkout (the directory that holds the `megatron`
package). Each FILE holds what `sextant export PLAN --to megatron-lm` writes: `#`
comment lines, then the arguments, one flag per line, joined by backslashes. The
header comment names the GPU count (the world size) and the hardware profile.

For each file, in a forked child so that no state leaks between files, the checker

  1. sets sys.argv to the file's arguments plus the flags a training run needs but
     a plan does not decide (SUPPLIED below), WORLD_SIZE / RANK / LOCAL_RANK the
     way a launcher would (parse_args reads WORLD_SIZE and RANK from the
     environment), and the variables the file's `# Environment: export NAME=VALUE`
     or `# Environment: unset NAME` lines direct (CUDA_DEVICE_MAX_CONNECTIONS
     starts unset);
  2. runs megatron.training.arguments.parse_args(ignore_unknown_args=False), so an
     unknown flag or a bad value fails as argparse fails;
  3. runs validate_args on the result;
  4. builds the TransformerConfig Megatron-LM builds from those arguments
     (core_transformer_config_from_args), whose __post_init__ checks the model
     and parallel sizes, the pipeline layout, recomputation, MoE and FP8 settings.

With --core, each FILE `NAME.txt` has beside it `NAME.core.py`, what `sextant
export PLAN --to megatron-core` writes for the same plan, and the checker also

  5. runs that Python file (its `initialize_model_parallel` call recorded, not
     run: there is no process group), so TransformerConfig's __post_init__
     checks the Megatron-Core export too;
  6. compares the TransformerConfig it built with the one of step 4, field by
     field over the fields that define the model and what the plan priced
     (COMPARED below, after __post_init__ derived its defaults), and the
     parallel sizes the Core file passes to initialize_model_parallel with the
     Megatron-LM arguments': the two exports of one plan must build the same
     model on the same grid. Where the Core export refused the plan
     (`NAME.core.refused` instead of `NAME.core.py`: CUDA graphs, which a
     Megatron-Core training loop captures itself), the file passes on its
     Megatron-LM check and the refusal is printed.

It prints, per file, `OK` or the first exception Megatron raised (type and
message on one line, and the stage it came from) or the fields the two exports
disagree on, then a count, and exits 1 if any failed (2 if Megatron cannot be
imported).

torch, Transformer Engine and Triton are not needed: a stub of each is put in
sys.modules before Megatron is imported (see `install_stubs`; Apex, flash-attn and
the other optional packages stay absent, which Megatron handles). Their attributes
are permissive placeholders, enough for import-time use (classes to subclass,
decorators that hand the function back, dtypes, `torch.cuda.is_available()` is
False, `torch.distributed.is_initialized()` is False). The GPU architecture that
validate_args asks for (torch.cuda.get_device_properties(...).major) comes from
the file's hardware profile. Megatron-LM main needs Python 3.12 or later, with
numpy and packaging installed (its argument code uses both):
`python3.12 -m venv v && v/bin/pip install numpy packaging typing_extensions`.

This file is the project's own code; nothing in it is taken from Megatron-LM.
"""

import argparse
import importlib.abc
import importlib.machinery
import os
import re
import shlex
import sys
import traceback
import types
import typing

# Flags a training run needs that a plan does not decide: data and tokenizer
# (Megatron asserts exactly one data source), and the length of the run.
SUPPLIED = [
    "--mock-data",
    "--tokenizer-type", "NullTokenizer",
    "--vocab-size", "128256",
    "--train-iters", "10",
    "--lr", "1e-4",
]

# Variables the export may direct in `# Environment:` lines; each check starts
# with them removed, as a clean launch would.
DIRECTED_ENV = ("CUDA_DEVICE_MAX_CONNECTIONS",)

# TransformerConfig fields the Megatron-LM and Megatron-Core exports of one plan
# must agree on (--core): the model's shape and kernels, the parallel layout and
# what the plan priced (recomputation, precision, loss, graphs, overlaps).
COMPARED = (
    # model
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
    "num_query_groups", "kv_channels", "gated_linear_unit", "activation_func",
    "bias_activation_fusion", "add_bias_linear", "add_qkv_bias", "normalization",
    "attention_dropout", "hidden_dropout", "window_size", "window_attn_skip_freq",
    "softmax_type", "glu_linear_offset", "activation_func_clamp_value", "qk_layernorm",
    "mtp_num_layers", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
    "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
    # mixture of experts
    "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_grouped_gemm",
    "moe_router_enable_expert_bias", "moe_router_score_function",
    "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
    "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
    # parallel layout
    "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size",
    "sequence_parallel", "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage", "pipeline_model_parallel_layout",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
    "pipeline_dtype",
    # what the plan priced
    "recompute_granularity", "recompute_method", "recompute_num_layers",
    "recompute_modules", "bf16", "fp16", "fp8", "fp8_recipe",
    "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "attention_backend",
    "cuda_graph_impl", "cuda_graph_modules", "tp_comm_overlap",
    "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
)

# initialize_model_parallel keywords and the Megatron-LM argument each must equal.
GRID = (
    ("tensor_model_parallel_size", "tensor_model_parallel_size"),
    ("pipeline_model_parallel_size", "pipeline_model_parallel_size"),
    ("virtual_pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size"),
    ("context_parallel_size", "context_parallel_size"),
    ("expert_model_parallel_size", "expert_model_parallel_size"),
    ("expert_tensor_parallel_size", "expert_tensor_parallel_size"),
)

# GPU compute capability (major) per Sextant hardware profile name prefix.
ARCH = [("a100", 8), ("h100", 9), ("h200", 9), ("h800", 9), ("b200", 10), ("gb200", 10), ("mi300", 9)]

STUB_ROOTS = ("torch", "transformer_engine", "transformer_engine_torch", "triton")
TORCH_VERSION = "2.8.0"
# Transformer Engine as Megatron-LM d98e8a6 pins it (pyproject.toml [tool.uv.sources]:
# TransformerEngine rev 4329ff84, whose build_tools/VERSION.txt reads 2.17.1);
# validate_args gates features on it (is_te_min_version).
TE_VERSION = "2.17.1"
TRITON_VERSION = "3.4.0"


# ---------------------------------------------------------------------------
# Stubs


class _StubMeta(type(typing.Protocol)):
    """Metaclass of placeholder classes: any attribute is another placeholder; a
    placeholder called with one callable hands it back (a decorator), otherwise it
    makes a placeholder instance. Subclasses defined by Megatron behave normally.
    It derives from Protocol's metaclass (an ABCMeta) so that Megatron's classes
    can have a placeholder and a Protocol or ABC as bases."""

    def __getattr__(cls, name):
        # Special names stay missing: typing and abc probe classes for them.
        if name.startswith(("__", "_is_", "_abc_")):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_stub_leaf"):
            if len(args) == 1 and not kwargs and callable(args[0]):
                return args[0]
            return super().__call__()
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __bool__(cls):
        return False


class _Stub(metaclass=_StubMeta):
    _stub_leaf = False

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(name)()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return type(self)()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getitem__(self, item):
        return self

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


def _placeholder(name):
    return _StubMeta(name.rsplit(".", 1)[-1], (_Stub,), {"_stub_leaf": True, "__module__": "stub"})


class _Dtype:
    def __init__(self, name, is_floating_point, itemsize):
        self.name = name
        self.is_floating_point = is_floating_point
        self.itemsize = itemsize

    def __repr__(self):
        return f"torch.{self.name}"


class _DeviceProperties:
    def __init__(self, major):
        self.major = major
        self.minor = 0
        self.name = f"stub sm_{major}0"
        self.total_memory = 80 * 2**30
        self.multi_processor_count = 132


class _StubModule(types.ModuleType):
    """A module whose missing attributes are placeholders."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STUB_ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        _fill(module)
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)


def _fill(m):
    """The few values Megatron's import-time and argument code reads as values."""
    name = m.__name__
    if name == "torch":
        m.__version__ = TORCH_VERSION
        dtypes = {
            "float32": (True, 4), "float16": (True, 2), "bfloat16": (True, 2),
            "float64": (True, 8), "float8_e4m3fn": (True, 1), "float8_e5m2": (True, 1),
            "uint8": (False, 1), "int8": (False, 1), "int16": (False, 2),
            "int32": (False, 4), "int64": (False, 8), "bool": (False, 1),
            "complex64": (False, 8),
        }
        for n, (fp, size) in dtypes.items():
            setattr(m, n, _Dtype(n, fp, size))
        m.float, m.half, m.double = m.float32, m.float16, m.float64
        m.long, m.int = m.int64, m.int32
        m.dtype = _Dtype
        m.is_grad_enabled = lambda: True
        m.get_default_dtype = lambda: m.float32
        m.compile = lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda f: f))
    elif name == "torch.version":
        m.cuda = "12.8"
        m.hip = None
        m.__version__ = TORCH_VERSION
    elif name == "torch.cuda":
        arch = int(os.environ.get("SEXTANT_CHECK_GPU_ARCH", "9"))
        m.is_available = lambda: False
        m.device_count = lambda: 0
        m.current_device = lambda: 0
        m.get_device_capability = lambda *a: (arch, 0)
        m.get_device_properties = lambda *a: _DeviceProperties(arch)
    elif name == "torch.distributed":
        m.is_available = lambda: True
        m.is_initialized = lambda: False
        m.get_rank = lambda *a, **k: int(os.environ.get("RANK", "0"))
        m.get_world_size = lambda *a, **k: int(os.environ.get("WORLD_SIZE", "1"))
    elif name == "transformer_engine":
        m.__version__ = TE_VERSION
    elif name == "transformer_engine.pytorch.optimizers":
        # OptimizerConfig reads FusedAdam's signature for the precision-aware
        # optimizer's keywords, which Transformer Engine 2.17 has.
        class FusedAdam:
            def __init__(self, params, lr=1e-3, master_weight_dtype=None, exp_avg_dtype=None,
                         exp_avg_sq_dtype=None, use_decoupled_grad=False, **kwargs):
                pass

        m.FusedAdam = FusedAdam
    elif name == "triton":
        m.__version__ = TRITON_VERSION


def install_stubs():
    sys.meta_path.insert(0, _StubFinder())
    import torch  # noqa: F401  (the stub)
    import torch.cuda  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.version  # noqa: F401


# ---------------------------------------------------------------------------
# Files


def read_export(path):
    """The argument list, the environment the export directs (name -> value, None
    for unset), and the header's GPU count and profile name."""
    if not os.path.isfile(path):  # a FIFO or device would block or never end
        raise ValueError("not a regular file")
    with open(path, encoding="utf-8") as f:
        text = f.read(1 << 20)
    header = re.search(r"^# Megatron-LM arguments for plan #\d+: .* on (\d+) GPUs \((.*)\)\.$", text, re.M)
    if not header:
        raise ValueError("no '# Megatron-LM arguments for plan #K: ... on N GPUs (PROFILE).' header")
    env = {}
    for m in re.finditer(r"^# Environment: (?:export (\w+)=(\S*)|unset (\w+))(?: \(.*)?$", text, re.M):
        if m.group(1):
            env[m.group(1)] = m.group(2)
        else:
            env[m.group(3)] = None
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    # Backslash-newline is a shell line continuation: the shell drops both characters.
    words = shlex.split(body.replace("\\\n", ""))
    return words, env, int(header.group(1)), header.group(2)


def arch_of(profile):
    for prefix, major in ARCH:
        if profile.lower().startswith(prefix):
            return major
    return 9


class ArgparseError(Exception):
    pass


def import_megatron(megatron_dir):
    """Megatron's argument module, imported once in the parent with the stubs in place."""
    install_stubs()
    sys.path.insert(0, megatron_dir)
    from megatron.training import arguments

    return arguments


def core_path(path):
    """The Megatron-Core export beside a Megatron-LM export (NAME.txt -> NAME.core.py)."""
    base = path[:-4] if path.endswith(".txt") else path
    return base + ".core.py"


def show(value):
    """A field's value as the comparison prints it: functions by name."""
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    return repr(value)


def run_core(path):
    """Runs a Megatron-Core export; returns its TransformerConfig and the keywords
    of its initialize_model_parallel call."""
    from megatron.core import parallel_state

    if not os.path.isfile(path):
        raise ValueError(f"no Megatron-Core export {path}")
    with open(path, encoding="utf-8") as f:
        source = f.read(1 << 20)
    grid = {}
    parallel_state.initialize_model_parallel = lambda **kw: grid.update(kw)
    scope = {"__name__": "sextant_core_export"}
    exec(compile(source, path, "exec"), scope)  # noqa: S102  (the file under test)
    if "config" not in scope:
        raise ValueError("the Megatron-Core export defines no `config`")
    return scope["config"], grid


def compare(lm_config, lm_args, core_config, grid):
    """The fields the two exports of one plan disagree on, as one line, or None."""
    diffs = []
    for name in COMPARED:
        # TransformerConfig reads pipeline_dtype only with a pipeline.
        if name == "pipeline_dtype" and getattr(lm_config, "pipeline_model_parallel_size", 1) == 1:
            continue
        a = getattr(lm_config, name, None)
        b = getattr(core_config, name, None)
        if show(a) != show(b):
            diffs.append(f"{name}: megatron-lm {show(a)}, megatron-core {show(b)}")
    dense = getattr(lm_config, "num_moe_experts", None) is None
    for key, arg in GRID:
        # A dense model's expert sizes are Megatron's defaults on both sides.
        if dense and key.startswith("expert_"):
            continue
        a = getattr(lm_args, arg, None)
        b = grid.get(key)
        if show(a) != show(b):
            diffs.append(f"initialize_model_parallel {key}: megatron-lm {show(a)}, megatron-core {show(b)}")
    return "; ".join(diffs) if diffs else None


def check_one(arguments, path, world_override, core=False):
    """Runs in the forked child; returns (stage, error) or None."""
    words, env, gpus, profile = read_export(path)
    world = world_override or gpus
    for name in DIRECTED_ENV:
        os.environ.pop(name, None)
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    os.environ.update(
        WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0",
        SEXTANT_CHECK_GPU_ARCH=str(arch_of(profile)),
    )
    sys.argv = ["pretrain_gpt.py", *words, *SUPPLIED]

    def argparse_error(parser, message):
        raise ArgparseError(message)

    # argparse reports a bad flag by printing and exiting; raise its message instead.
    argparse.ArgumentParser.error = argparse_error
    stage = "parse_args"
    try:
        args = arguments.parse_args(ignore_unknown_args=False)
        stage = "validate_args"
        arguments.validate_args(args)
        stage = "TransformerConfig"
        lm_config = arguments.core_transformer_config_from_args(args)
        if core:
            refused = core_path(path)[: -len(".py")] + ".refused"
            if not os.path.exists(core_path(path)) and os.path.isfile(refused):
                with open(refused, encoding="utf-8") as f:
                    return "refused", " ".join(f.read(4096).split())
            stage = "megatron-core export"
            core_config, grid = run_core(core_path(path))
            stage = "megatron-core against megatron-lm"
            diff = compare(lm_config, args, core_config, grid)
            if diff:
                return stage, diff
    except BaseException as e:  # noqa: BLE001  (everything Megatron raises is the answer)
        if os.environ.get("SEXTANT_CHECK_TRACE"):
            traceback.print_exc()
        return stage, f"{type(e).__name__}: {e}"
    return None


def run_forked(arguments, path, world_override, core=False):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if not os.environ.get("SEXTANT_CHECK_TRACE"):
            # Megatron's own warnings and notices; the verdict goes through the pipe.
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
        try:
            result = check_one(arguments, path, world_override, core)
            if result is None:
                msg = "OK"
            elif result[0] == "refused":
                msg = f"OK (the megatron-core export refused the plan: {result[1]})"
            else:
                msg = f"FAIL [{result[0]}] {result[1]}"
        except BaseException as e:  # noqa: BLE001
            msg = f"FAIL [read] {type(e).__name__}: {e}"
        sys.stdout.flush()
        sys.stderr.flush()
        data = " ".join(msg.splitlines()).encode("utf-8", "replace")
        while data:
            data = data[os.write(w, data):]
        os.close(w)
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    msg = b"".join(chunks).decode("utf-8", "replace")
    if not msg:
        msg = f"FAIL [crash] checker child ended with status {status}"
    return msg


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("megatron_dir", help="Megatron-LM checkout (holds the megatron package)")
    p.add_argument("files", nargs="+", help="files written by sextant export --to megatron-lm")
    p.add_argument("--world-size", type=int, default=None, help="override the header's GPU count")
    p.add_argument("--quiet", action="store_true", help="print only failures and the count")
    p.add_argument("--core", action="store_true", help="also run each FILE's Megatron-Core export (NAME.txt -> NAME.core.py) and compare the two TransformerConfigs")
    a = p.parse_args()
    if not os.path.isfile(os.path.join(a.megatron_dir, "megatron", "training", "arguments.py")):
        print(f"error: {a.megatron_dir} has no megatron/training/arguments.py; give a Megatron-LM checkout", file=sys.stderr)
        sys.exit(2)
    quiet_import = not os.environ.get("SEXTANT_CHECK_TRACE")
    saved = os.dup(2)
    if quiet_import:
        # Megatron warns at import about every optional package it lacks.
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    try:
        arguments = import_megatron(os.path.abspath(a.megatron_dir))
    except Exception as e:  # noqa: BLE001
        os.dup2(saved, 2)
        if not quiet_import:
            traceback.print_exc()
        print(f"error: importing megatron.training.arguments with the stubs failed: {type(e).__name__}: {e} (SEXTANT_CHECK_TRACE=1 shows where)", file=sys.stderr)
        sys.exit(2)
    os.dup2(saved, 2)
    os.close(saved)
    failed = 0
    for path in a.files:
        msg = run_forked(arguments, path, a.world_size, a.core)
        ok = msg.startswith("OK")
        if not ok:
            failed += 1
        if not ok or not a.quiet:
            print(f"{path}: {msg}", flush=True)
    print(f"{len(a.files)} checked, {len(a.files) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
