"""Griffe extension: document an `Engine` verb that delegates to a component.

``Engine.register_presence = Delegate("lanes", Lanes.register_presence)``
is, read on an engine, the component's bound method with its signature and
docstring (`service_engine.beat.component.Delegate`). Griffe sees only an
assignment, so this extension replaces each such class attribute by an alias
of the method it names: the reference shows the verb as the method it is.
"""

from __future__ import annotations

from typing import Any

import griffe


class Delegates(griffe.Extension):
    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        value = attr.value
        if not (
            isinstance(value, griffe.ExprCall)
            and str(value.function) == "Delegate"
            and len(value.arguments) == 2
            and isinstance(value.arguments[1], griffe.ExprAttribute)
        ):
            return
        parent = attr.parent
        if parent is None:
            return
        target = value.arguments[1].canonical_path
        parent.set_member(attr.name, griffe.Alias(attr.name, target, parent=parent))
