"""A trainer's saved arguments read without running anything from the file.

transformers' ``Trainer`` saves its arguments as ``training_args.bin``: ``torch.save`` of the ``TrainingArguments``
(TRL: ``GRPOConfig``) object, a zip archive whose ``data.pkl`` is a pickle. Unpickling calls whatever the pickle
names, so a crafted file runs code the moment it is loaded. :func:`read_training_args_bin` never unpickles it
with the real classes: a restricted unpickler maps the few globals a real file names (the arguments'
dataclasses, the enums they hold, ``torch.device``, accelerate's ``PartialState``: :data:`ALLOWED`) to inert
stand-ins that only keep their fields, and refuses every other global, persistent id (a tensor) or
extension code. Nothing of TRL, transformers or torch is imported or constructed; enums come back as their
values (``"steps"``), ``torch.device`` as its string.

:func:`read_training_args_json` reads ``gmts_training_args.json`` (the arguments' ``to_dict()``, written by the
example script), which needs none of this.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.util.files import read_json_object, require_regular

#: a real training_args.bin is a few kB; anything far larger is not one
MAX_PICKLE_BYTES = 4 << 20

#: the arguments' classes: ``module.name`` -> kind (``args``: the arguments object and the dataclasses it
#: holds, kept as :class:`SavedArgs`; ``value``: an enum or ``torch.device``, kept as its value; ``constant``: a
#: torch dtype, kept as its name)
ALLOWED: dict[str, str] = {
    "trl.trainer.grpo_config.GRPOConfig": "args",
    # the drop-in's config: where it lives (integrations/trl/config.py), and where runs trained before it moved
    # there saved it from (integrations/trl_trainer.py, now a re-export)
    "gmts_analysis.integrations.trl.config.SelectiveGRPOConfig": "args",
    "gmts_analysis.integrations.trl_trainer.SelectiveGRPOConfig": "args",
    "transformers.training_args.TrainingArguments": "args",
    "transformers.trainer_pt_utils.AcceleratorConfig": "args",
    "accelerate.state.PartialState": "args",
    "accelerate.utils.dataclasses.DistributedType": "value",
    "transformers.trainer_utils.HubStrategy": "value",
    "transformers.trainer_utils.IntervalStrategy": "value",
    "transformers.trainer_utils.SaveStrategy": "value",
    "transformers.trainer_utils.SchedulerType": "value",
    "transformers.trainer_utils.FSDPOption": "value",
    "transformers.training_args.OptimizerNames": "value",
    "transformers.debug_utils.DebugOption": "value",
    "torch.device": "value",
    # a dtype object in model_init_kwargs (``{"dtype": torch.bfloat16}``): kept as its name
    **{f"torch.{d}": "constant" for d in ("float32", "float16", "bfloat16", "float64")},
}


class SavedArgs:
    """The fields of a saved arguments object, as attributes; ``saved_class``: the class it was saved as
    (``module.name``; ``None`` for a JSON file, which does not say)."""

    saved_class: str | None = None

    def __init__(self, *args: Any, **kw: Any) -> None:  # an object rebuilt by REDUCE: its arguments are kept
        self.__dict__["_args"] = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update({k: v for k, v in state.items()
                                  if isinstance(k, str) and not k.startswith("_") and k not in _RESERVED})

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __repr__(self) -> str:
        return f"SavedArgs({self.saved_class})"


#: names a saved field may not take (they would hide what the reader itself says about the file)
_RESERVED = frozenset(n for n in dir(SavedArgs) if not n.startswith("__"))


def _value(*args: Any) -> Any:
    """An enum member or ``torch.device`` rebuilt by REDUCE: its value."""
    if len(args) == 1:
        return args[0]
    return ":".join(str(a) for a in args if a is not None)


_STUBS: dict[str, type] = {}


def _stub(name: str) -> Any:
    if ALLOWED[name] == "value":
        return _value
    if ALLOWED[name] == "constant":
        return name
    if name not in _STUBS:
        _STUBS[name] = type(name.rsplit(".", 1)[1], (SavedArgs,), {"saved_class": name})
    return _STUBS[name]


class _Refused(Exception):
    pass


class _ArgsUnpickler(pickle.Unpickler):
    """Builds only :data:`ALLOWED` stand-ins; any other global, a persistent id or an extension code is
    refused before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full not in ALLOWED:
            raise _Refused(f"it names {full}, which is not one of the trainer arguments' types")
        return _stub(full)

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("it holds tensor data, which trainer arguments never hold")


def _data_pkl(f: Path) -> bytes:
    try:
        with zipfile.ZipFile(f) as z:
            names = [n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if len(names) != 1:
                raise GmtsError(f"{f}: not a torch.save archive of trainer arguments (no single data.pkl); "
                                "nothing in it was read")
            info = z.getinfo(names[0])
            if info.file_size > MAX_PICKLE_BYTES:
                raise GmtsError(f"{f}: its data.pkl is {info.file_size} bytes, too large for trainer arguments; "
                                "nothing in it was read")
            return z.read(info)
    except zipfile.BadZipFile:
        raise GmtsError(f"{f}: not a torch.save zip archive (trainer arguments are saved as one); not unpickled"
                        ) from None
    except OSError as e:
        raise GmtsError(f"{f}: cannot be read ({e.strerror or e})") from None


def read_training_args_bin(path: str | os.PathLike) -> SavedArgs:
    """The trainer arguments in ``path`` (a ``training_args.bin``) as :class:`SavedArgs`, read by the restricted
    unpickler (module docstring). Raises :class:`GmtsError` (one line naming the file) for a file that names any
    other type, holds tensors, or is not a ``torch.save`` archive: such a file is refused, never run."""
    f = Path(path)
    require_regular(f, str(f))
    data = _data_pkl(f)
    try:
        obj = _ArgsUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise GmtsError(f"{f}: refused, not unpickled: {e} (a file that would run code?); nothing in it ran; "
                        "take the run folder again from a source you trust") from None
    except Exception as e:  # truncated, a corrupt opcode stream, a stand-in given odd arguments
        raise GmtsError(f"{f}: not a readable pickle of trainer arguments ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''}); nothing in it ran") from None
    if not isinstance(obj, SavedArgs) or obj.saved_class not in ALLOWED or obj.saved_class in (
            "transformers.trainer_pt_utils.AcceleratorConfig", "accelerate.state.PartialState"):
        raise GmtsError(f"{f}: holds {type(obj).__name__}, not trainer arguments (GRPOConfig or TrainingArguments)")
    return obj


def read_training_args_json(path: str | os.PathLike) -> SavedArgs:
    """The trainer arguments in ``path`` (``gmts_training_args.json``: a JSON object of the arguments'
    ``to_dict()``) as :class:`SavedArgs`; its ``saved_class`` is the object's ``"class"`` entry when it has one
    (with the fields under ``"args"``), else ``None``."""
    j = read_json_object(Path(path))
    cls = None
    if isinstance(j.get("args"), dict) and isinstance(j.get("class"), str):
        cls, j = j["class"], j["args"]
    out = SavedArgs()
    out.__setstate__(j)
    out.__dict__["saved_class"] = cls
    return out
