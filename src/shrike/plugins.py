"""Out-of-tree plugins: packages that add model architectures, quantization schemes or kernel ops.

A plugin is a Python package with an entry point in the ``shrike.plugins`` group::

    [project.entry-points."shrike.plugins"]
    my-plugin = "my_package:register"

``register(registry)`` receives a ``PluginRegistrar`` and calls its ``register_architecture``,
``register_quantization``, ``register_op`` and ``register_tool_parser`` methods. What a plugin registers takes priority
over Shrike's built-ins (see ``shrike.registry``).

``SHRIKE_PLUGINS`` chooses which installed plugins load: unset loads all of them, an empty value
loads none, ``a,b`` loads exactly those.
"""

import os
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points

from shrike.errors import ConfigError
from shrike.registry import Registry

ENTRY_POINT_GROUP = "shrike.plugins"
SELECTION_VARIABLE = "SHRIKE_PLUGINS"


class PluginRegistrar:
    """What a plugin's ``register()`` receives: everything it adds is recorded as that plugin's."""

    def __init__(self, registry: Registry, plugin: str) -> None:
        self._registry = registry
        self.plugin = plugin

    def register_architecture(self, name: str, factory: Callable) -> None:
        self._registry.register_architecture(name, factory, source="plugin", provider=self.plugin)

    def register_quantization(self, name: str, scheme: type) -> None:
        self._registry.register_quantization(name, scheme, source="plugin", provider=self.plugin)

    def register_op(self, op: str, fn: Callable) -> None:
        self._registry.register_op(op, fn, source="plugin", provider=self.plugin)

    def register_tool_parser(self, name: str, parser: type) -> None:
        """parser: a shrike.server.tools.ToolParser subclass, chosen with --tool-call-parser NAME."""
        self._registry.register_tool_parser(name, parser, source="plugin", provider=self.plugin)


def installed_plugins() -> dict[str, EntryPoint]:
    return {entry_point.name: entry_point for entry_point in entry_points(group=ENTRY_POINT_GROUP)}


def selected_plugins(installed: Mapping[str, EntryPoint], selection: str | None) -> list[str]:
    """Names ``SHRIKE_PLUGINS`` (``selection``) picks out of the installed plugins."""
    if selection is None:
        return sorted(installed)
    wanted = [name.strip() for name in selection.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in installed]
    if unknown:
        available = ", ".join(sorted(installed)) or "none"
        raise ConfigError(
            f"{SELECTION_VARIABLE} names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not "
            f"installed (installed plugins: {available}); fix the name or install the plugin"
        )
    return list(dict.fromkeys(wanted))


def load_plugins(
    registry: Registry, environ: Mapping[str, str] = os.environ, installed: Mapping[str, EntryPoint] | None = None
) -> None:
    """Run the ``register()`` of each plugin ``SHRIKE_PLUGINS`` selects from ``installed`` (default: all installed)."""
    installed = installed_plugins() if installed is None else installed
    for name in selected_plugins(installed, environ.get(SELECTION_VARIABLE)):
        entry_point = installed[name]
        try:
            register = entry_point.load()
            register(PluginRegistrar(registry, name))
        except ConfigError:
            raise
        except Exception as error:
            raise ConfigError(
                f"plugin {name!r} ({entry_point.value}) failed to load: {type(error).__name__}: {error}; "
                f"update or uninstall it, or leave it out of {SELECTION_VARIABLE}"
            ) from error
        registry.plugins.append(name)


def build_registry(environ: Mapping[str, str] = os.environ) -> Registry:
    """A registry with Shrike's built-in ops, architectures and quantization scheme, and the selected plugins
    (the server adds its tool-call parsers: shrike.server.tools.build_server_registry)."""
    # Imported here because the built-in ops need the kernel extension, and listing installed
    # plugins must work without it (shrike doctor reports a broken extension that way).
    from shrike.model.gemma3 import register_architectures as register_gemma3
    from shrike.model.llama import register_architectures
    from shrike.model.moe import register_architectures as register_moe
    from shrike.ops import register_builtin_ops
    from shrike.quantization.loading import QuantizedLinearFactory

    registry = Registry()
    register_builtin_ops(registry)
    register_architectures(registry)
    register_gemma3(registry)
    register_moe(registry)
    registry.register_quantization("compressed-tensors", QuantizedLinearFactory)
    load_plugins(registry, environ)
    registry.check_ops()
    return registry
