"""What every recipe section is built from: the strict base model, the validation error the
loader prints as it is, and the file and code-reference field types (edgeflow.schema.sections)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationInfo,
)
from pydantic_core import PydanticCustomError

from edgeflow.core.refcheck import TORCH_MODULE, Found, subclass_of
from edgeflow.core.refs import ImportRef


def user_error(message: str, hint: str | None = None, at: str = "") -> PydanticCustomError:
    """A validation error the recipe loader prints as it is; `at` relocates it to a dotted key."""
    ctx = {"message": message, "hint": hint or "", "at": at}
    return PydanticCustomError("edgeflow", "{message}", ctx)


def _base_dir(info: ValidationInfo) -> Path:
    context = info.context or {}
    return Path(context.get("base_dir", "."))


def _existing_file(value: Any, info: ValidationInfo) -> Path:
    if not isinstance(value, str | Path):
        raise user_error(f"expected a file path (got {value!r})")
    try:
        path = (_base_dir(info) / value).resolve()
        found = path.is_file()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a name too long, NUL
        raise user_error(
            f"not a usable file path: {value!s:.200} ({type(exc).__name__}: {exc!s:.200})",
            "paths are relative to the recipe's folder; fix the path",
        ) from None
    if not found:
        raise user_error(
            f"file not found: {value} (resolved to {path})",
            "paths are relative to the recipe's folder; create the file or fix the path",
        )
    return path


def _import_ref(value: Any, info: ValidationInfo) -> ImportRef:
    return _checked_ref(value, info)[0]


def _checked_ref(value: Any, info: ValidationInfo) -> tuple[ImportRef, Found]:
    """A reference, and what it names found from its source (refs.ImportRef.check)."""
    if not isinstance(value, str):
        raise user_error(f"expected 'package.module:Name' (got {value!r})")
    try:
        ref = ImportRef.parse(value, _base_dir(info))
        found = ref.check()
    except ValueError as exc:
        hint = getattr(exc, "hint", None) or "write it as 'package.module:Name' or 'file.py:Name'"
        raise user_error(str(exc), hint) from None
    return ref, found


def _torch_module_ref(value: Any, info: ValidationInfo) -> ImportRef:
    """A class that subclasses torch.nn.Module, or a function that builds one: a class whose
    bases its source shows to lead elsewhere is refused (a class source cannot decide is
    checked with issubclass after import, before it is called)."""
    ref, found = _checked_ref(value, info)
    if found.kind == "class" and subclass_of(found, TORCH_MODULE) is False:
        raise user_error(
            f"{ref} is a class that does not subclass torch.nn.Module ({found.name})",
            "name your torch.nn.Module subclass, or a function that returns the module",
        )
    return ref


RecipeFile = Annotated[Path, BeforeValidator(_existing_file)]
CodeRef = Annotated[ImportRef, BeforeValidator(_import_ref)]
TorchModuleRef = Annotated[ImportRef, BeforeValidator(_torch_module_ref)]


class Strict(BaseModel):
    """Recipe sections: unknown keys are errors, and values are taken as written (strict: a
    boolean is no number, a string no number; NaN and infinities are refused)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        arbitrary_types_allowed=True,
        strict=True,
        allow_inf_nan=False,
    )
