"""Griffe extension: load the modules of nested namespace packages.

``service_engine/messaging/`` has no ``__init__.py``; Python imports it as a
namespace package, but Griffe collects only sub-packages with one, so the
root package's names re-exported from it (``Acked``, ``IntegrationEvent``,
...) would not resolve. This extension adds every such folder of a loaded
package, with its modules, to the package's tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import griffe


class NamespacePackages(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        self._add_namespaces(pkg, loader)

    def _add_namespaces(self, package: griffe.Module, loader: griffe.GriffeLoader) -> None:
        filepath = package.filepath
        if not isinstance(filepath, Path) or filepath.name != "__init__.py":
            return
        for folder in sorted(filepath.parent.iterdir()):
            if (
                not folder.is_dir()
                or folder.name in package.members
                or not folder.name.isidentifier()
                or (folder / "__init__.py").exists()
                or not any(folder.glob("*.py"))
            ):
                continue
            namespace = griffe.Module(folder.name, filepath=[folder], parent=package)
            package.set_member(folder.name, namespace)
            for source in sorted(folder.glob("*.py")):
                module = griffe.visit(
                    source.stem,
                    source,
                    source.read_text(encoding="utf-8"),
                    parent=namespace,
                    extensions=loader.extensions,
                    docstring_parser=loader.docstring_parser,
                    docstring_options=loader.docstring_options,
                    lines_collection=loader.lines_collection,
                    modules_collection=loader.modules_collection,
                )
                namespace.set_member(source.stem, module)
        for member in list(package.members.values()):
            if isinstance(member, griffe.Module) and not member.is_alias and member.is_package:
                self._add_namespaces(member, loader)
