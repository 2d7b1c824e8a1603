"""Build frozen slotted dataclass instances on hot paths.

A frozen dataclass's ``__init__`` sets each field through
``object.__setattr__``: about 0.1 µs a field here, which is most of the cost of
a :class:`TensorChunk` per chunk or a :class:`TensorInfo` per tensor. A
*twin*, a plain class with the same slots on the same base, is filled with
ordinary attribute stores (which CPython specializes for slots) and then
becomes an instance of the frozen class by assigning ``__class__``: the two
layouts are identical, so CPython allows the switch, and the result is an
ordinary instance of the frozen class: equal to, and as immutable as, one
built by its ``__init__``. Only binproto's own code builds instances this way,
from values it has already validated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

__all__ = ["fast_constructor", "twin"]


def twin(cls: type) -> Any:
    """A plain class with exactly the slots of the frozen slotted dataclass ``cls``."""
    slots = cls.__dict__.get("__slots__")
    base = cls.__base__
    if not slots or base is None or cast(Any, base).__setattr__ is not object.__setattr__:
        raise TypeError(f"{cls.__name__} needs its own slots on a base with plain attributes")
    return type(f"_{cls.__name__}Fields", (base,), {"__slots__": slots})


def fast_constructor(cls: type) -> Callable[..., Any]:
    """A constructor taking every field of ``cls`` positionally, in order.

    Generated like a dataclass's own ``__init__``: one store per field into a
    twin, then the switch of class.
    """
    fields: tuple[str, ...] = cls.__dict__["__slots__"]
    stores = "".join(f"    obj.{name} = {name}\n" for name in fields)
    source = (
        f"def make_{cls.__name__}({', '.join(fields)}):\n"
        "    obj = new(fields_class)\n"
        f"{stores}"
        "    obj.__class__ = cls\n"
        "    return obj\n"
    )
    namespace: dict[str, Any] = {"new": object.__new__, "fields_class": twin(cls), "cls": cls}
    exec(source, namespace)  # the source holds only the class's own field names
    return cast(Callable[..., Any], namespace[f"make_{cls.__name__}"])
