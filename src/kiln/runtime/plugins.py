"""The plug-in registry: which module brings which device, module type and code generator.

A *plug-in* is a back end Kiln does not build into its core tables: the built-in ``cuda``
and ``opencl`` back ends as much as a third-party package. Each is described once, by a
:class:`Plugin` descriptor (plain data, no imports):

* ``devices`` -- DLPack device type codes with their names and aliases (``kiln.device("cl")``);
* ``loaders`` -- module type keys (``loadbinary_<key>``) of the libraries it can load;
* ``codegens`` -- target kinds it has a code generator for (``target.build.<kind>``);
* ``device_module`` / ``loader_module`` / ``codegen_module`` -- what to import, the first time
  one of the above is asked for, so that the import registers the real object (a
  :class:`~kiln.runtime.device.DeviceAPI`, a loader, a codegen) in the ordinary registry.

The core registries (``kiln.runtime.device``, ``kiln.runtime.registry``,
``kiln.codegen.registry``) ask this module on a miss and never name a back end themselves.
Target kinds (options, schedule knobs) are not part of a descriptor: they are declared with
``kiln.target.register_target_kind`` so that naming a target imports nothing.

Where descriptors come from, in lookup order:

1. :data:`BUILTIN_PLUGINS`, the one list of Kiln's own plug-ins (read without any import);
2. :func:`register_plugin`, for code that wants to register one by hand (tests, notebooks);
3. the ``importlib.metadata`` entry-point group :data:`ENTRY_POINT_GROUP` (``kiln.plugins``):
   each entry point names a :class:`Plugin`, a mapping of its fields, or a callable returning
   either. Discovery is lazy: it runs once, on the first lookup that the two sources above
   cannot answer, never at ``import kiln`` (reading the installed distributions costs tens of
   milliseconds; ``python -X importtime -c "import kiln"`` lists no ``importlib.metadata``).

Module names in a descriptor may be relative (``".runtime.cuda_driver"``) to the descriptor's
``package``. The built-in descriptors use that form: this module only *stores* the names, and
each facet is imported by the registry of its own layer (a codegen module by
``kiln.codegen.registry``), so the runtime still imports nothing above itself.

A plug-in that cannot be used -- an entry point that does not load, a descriptor that does
not validate, a module whose import fails, a module that imports but registers nothing --
raises :class:`PluginError` (a :class:`~kiln.runtime.errors.KilnError`), whose message names
the plug-in, where it came from and what failed. Imports only the standard library.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import threading
from types import ModuleType
from typing import Any, Callable, Mapping, NamedTuple

from .errors import KilnError

__all__ = [
    "Plugin",
    "PluginDevice",
    "PluginError",
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "register_plugin",
    "list_plugins",
    "get_plugin",
    "find_device_type",
    "find_device_name",
    "find_loader",
    "find_codegen",
    "import_facet",
    "device_names",
    "discover",
    "discovery_errors",
]

#: ``importlib.metadata`` entry-point group third-party plug-ins are published under.
ENTRY_POINT_GROUP = "kiln.plugins"

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FACETS = ("device", "loader", "codegen")


class PluginError(KilnError, RuntimeError):
    """A plug-in is malformed or failed to load; the message names the plug-in and the step."""


# Descriptors are NamedTuples, not dataclasses: kiln.runtime.device imports this module at
# ``import kiln``, and a frozen dataclass costs milliseconds to create (dataclasses is not
# otherwise imported by then).


class PluginDevice(NamedTuple):
    """One device type a plug-in serves.

    Parameters
    ----------
    type_code : int
        DLPack device type code (2 is CUDA, 4 OpenCL; a new device picks an unused code).
    name : str
        Canonical name, used by ``str(Device)`` and ``kiln.device(name)``.
    aliases : tuple of str, optional
        Other names ``kiln.device()`` accepts (``"gpu"`` for CUDA, ``"cl"`` for OpenCL).
    """

    type_code: int
    name: str
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The canonical name followed by the aliases, all lower case."""
        return tuple(n.lower() for n in (self.name, *self.aliases))


class Plugin(NamedTuple):
    """The description of one plug-in: what it provides and which module provides each part.

    Parameters
    ----------
    name : str
        Plug-in name (an identifier); errors name it.
    devices : tuple of PluginDevice
        Device types it serves.
    loaders : tuple of str
        Module type keys it can load (``loadbinary_<key>``).
    codegens : tuple of str
        Target kinds it generates code for (``target.build.<kind>``).
    device_module, loader_module, codegen_module : str, optional
        Module whose import registers the device APIs / loaders (and payload describers) /
        codegens. A name starting with ``.`` is relative to ``package``. ``loader_module``
        defaults to ``device_module`` (one runtime module usually registers both).
    package : str, optional
        Anchor of relative module names.
    origin : str
        Where the descriptor came from (``"built-in"``, ``"entry point fake = pkg:PLUGIN"``);
        filled in by the registry.

    Examples
    --------
    >>> Plugin("mygpu", devices=(PluginDevice(77, "mygpu"),), loaders=("mygpu",),
    ...        codegens=("mygpu",), device_module="mygpu.runtime", codegen_module="mygpu.codegen").loaders
    ('mygpu',)
    """

    name: str
    devices: tuple[PluginDevice, ...] = ()
    loaders: tuple[str, ...] = ()
    codegens: tuple[str, ...] = ()
    device_module: str | None = None
    loader_module: str | None = None
    codegen_module: str | None = None
    package: str | None = None
    origin: str = "registered"

    def module_for(self, facet: str) -> str | None:
        """The absolute name of the module to import for ``facet`` ("device", "loader", "codegen")."""
        if facet not in _FACETS:
            raise PluginError(f"plug-in {self.name!r}: unknown facet {facet!r} (one of {', '.join(_FACETS)})")
        mod = getattr(self, f"{facet}_module")
        if mod is None and facet == "loader":
            mod = self.device_module
        if mod is not None and mod.startswith("."):
            mod = importlib.util.resolve_name(mod, self.package or "")
        return mod


def _validate(p: Plugin) -> Plugin:
    """``p`` with tuples normalized; PluginError naming the plug-in and the bad field otherwise."""
    where = f"plug-in {p.name!r} ({p.origin})"
    if not isinstance(p.name, str) or not _NAME_RE.match(p.name):
        raise PluginError(f"plug-in from {p.origin}: name must be an identifier, got {p.name!r}")
    try:
        devices = tuple(d if isinstance(d, PluginDevice) else PluginDevice(**d) if isinstance(d, Mapping)
                        else PluginDevice(*d) for d in p.devices)
        if any(isinstance(d.aliases, str) for d in devices):
            raise TypeError("aliases must be a tuple of names, not a string")
        devices = tuple(d._replace(aliases=tuple(d.aliases)) for d in devices)
    except TypeError as err:
        raise PluginError(f"{where}: bad devices entry: {err}") from None
    for d in devices:
        if isinstance(d.type_code, bool) or not isinstance(d.type_code, int) or d.type_code <= 0:
            raise PluginError(f"{where}: device type code must be a positive int, got {d.type_code!r}")
        if not all(isinstance(n, str) and _NAME_RE.match(n) for n in (d.name, *d.aliases)):
            raise PluginError(f"{where}: device names must be identifiers, got {d.names!r}")
    for fld in ("loaders", "codegens"):
        vals = getattr(p, fld)
        if not isinstance(vals, (tuple, list)) or not all(isinstance(v, str) and v for v in vals):
            raise PluginError(f"{where}: {fld} must be a tuple of non-empty strings, got {vals!r}")
    for fld in ("device_module", "loader_module", "codegen_module", "package"):
        v = getattr(p, fld)
        if v is not None and (not isinstance(v, str) or not v):
            raise PluginError(f"{where}: {fld} must be a module name, got {v!r}")
    needs = [("device", bool(devices)), ("loader", bool(p.loaders)), ("codegen", bool(p.codegens))]
    for facet, used in needs:
        if used and not (getattr(p, f"{facet}_module") or (facet == "loader" and p.device_module)):
            raise PluginError(f"{where}: declares {facet}s but no {facet}_module to import for them")
    if any(getattr(p, f, "") and getattr(p, f).startswith(".") for f in ("device_module", "loader_module",
                                                                        "codegen_module")) and not p.package:
        raise PluginError(f"{where}: relative module names need package=...")
    return Plugin(p.name, devices, tuple(p.loaders), tuple(p.codegens), p.device_module, p.loader_module,
                  p.codegen_module, p.package, p.origin)


#: Kiln's own plug-ins: the one place that says which modules serve CUDA and OpenCL. Their
#: target kinds (and the schedule knobs a GPU kind carries) are declared in kiln.target.
BUILTIN_PLUGINS: tuple[Plugin, ...] = (
    Plugin("cuda", devices=(PluginDevice(2, "cuda", ("gpu", "nvptx")),), loaders=("cuda",), codegens=("cuda",),
           device_module=".runtime.cuda_driver", codegen_module=".codegen.cuda", package="kiln", origin="built-in"),
    Plugin("opencl", devices=(PluginDevice(4, "opencl", ("cl",)),), loaders=("opencl",), codegens=("opencl",),
           device_module=".runtime.opencl_driver", codegen_module=".codegen.opencl", package="kiln",
           origin="built-in"),
)

_LOCK = threading.RLock()
_REGISTERED: dict[str, Plugin] = {p.name: p for p in BUILTIN_PLUGINS}
_DISCOVERED = False
_DISCOVERY_ERRORS: dict[str, str] = {}


def register_plugin(plugin: Plugin | Mapping[str, Any], override: bool = False) -> Plugin:
    """Register a plug-in descriptor by hand (entry points do this for installed packages).

    Parameters
    ----------
    plugin : Plugin or mapping
        The descriptor, or a mapping of :class:`Plugin`'s fields (``devices`` entries may be
        mappings of :class:`PluginDevice`'s fields).
    override : bool
        Replace a plug-in of the same name instead of raising.

    Returns
    -------
    Plugin
        The validated descriptor as stored.

    Raises
    ------
    PluginError
        If the descriptor is malformed, its name is taken, or a device code, device name,
        loader key or codegen kind it claims already belongs to another plug-in.
    """
    p = _validate(_coerce(plugin, "registered"))
    with _LOCK:
        _add(p, override)
    return p


def _coerce(obj: Any, origin: str) -> Plugin:
    if isinstance(obj, Plugin):
        return obj if obj.origin != "registered" else obj._replace(origin=origin)
    if isinstance(obj, Mapping):
        try:
            return Plugin(**{**obj, "origin": origin})
        except TypeError as err:
            raise PluginError(f"plug-in from {origin}: bad descriptor fields: {err}") from None
    raise PluginError(f"plug-in from {origin}: expected a kiln.runtime.plugins.Plugin or a mapping, "
                      f"got {type(obj).__name__}")


def _add(p: Plugin, override: bool) -> None:
    old = _REGISTERED.get(p.name)
    if old is not None and not override:
        raise PluginError(f"plug-in {p.name!r} ({p.origin}) is already registered ({old.origin}); "
                          "pass override=True to replace it")
    # A code, name, key or kind claimed twice would make lookups depend on discovery order.
    for other in _REGISTERED.values():
        if other.name == p.name:
            continue
        clash = ({d.type_code for d in p.devices} & {d.type_code for d in other.devices}
                 or set(_all_names(p)) & set(_all_names(other))
                 or set(p.loaders) & set(other.loaders) or set(p.codegens) & set(other.codegens))
        if clash:
            raise PluginError(f"plug-in {p.name!r} ({p.origin}) claims {sorted(map(str, clash))} already provided "
                              f"by plug-in {other.name!r} ({other.origin})")
    _REGISTERED[p.name] = p


def _all_names(p: Plugin) -> list[str]:
    return [n for d in p.devices for n in d.names]


def discover() -> dict[str, str]:
    """Load the ``kiln.plugins`` entry points (once) and register their descriptors.

    An entry point that fails to load or validate is skipped and recorded, so one broken
    package cannot hide the others; :func:`discovery_errors` returns the records, and lookups
    that find nothing mention them.

    Returns
    -------
    dict
        Plug-in (entry point) name -> error message, for the entry points that failed.
    """
    global _DISCOVERED
    with _LOCK:
        if _DISCOVERED:
            return dict(_DISCOVERY_ERRORS)
        _DISCOVERED = True
        # Imported here, not at the top: importlib.metadata costs ~15 ms to import and the scan
        # of installed distributions more; only a lookup miss pays for it.
        from importlib.metadata import entry_points

        try:
            eps = list(entry_points(group=ENTRY_POINT_GROUP))
        except Exception as err:  # noqa: BLE001 - broken distribution metadata must not break lookups
            _DISCOVERY_ERRORS["<entry points>"] = f"reading entry points failed: {type(err).__name__}: {err}"
            return dict(_DISCOVERY_ERRORS)
        for ep in eps:
            origin = f"entry point {ep.name} = {ep.value}"
            if ep.name in _REGISTERED and _REGISTERED[ep.name].origin == "built-in":
                continue  # an installed copy of Kiln's own metadata must not clash with itself
            try:
                obj = ep.load()
                if callable(obj) and not isinstance(obj, (Plugin, Mapping)):
                    obj = obj()
                p = _validate(_coerce(obj, origin))
                if p.name != ep.name:
                    raise PluginError(f"entry point {ep.name!r} describes a plug-in named {p.name!r}")
                _add(p, override=False)
            except Exception as err:  # noqa: BLE001 - recorded and reported, see the docstring
                msg = str(err) if isinstance(err, PluginError) else f"{type(err).__name__}: {err}"
                _DISCOVERY_ERRORS[ep.name] = f"plug-in {ep.name!r} ({origin}) failed to load: {msg}"
        return dict(_DISCOVERY_ERRORS)


def discovery_errors() -> dict[str, str]:
    """Plug-in name -> why its entry point was skipped (empty before :func:`discover` ran)."""
    with _LOCK:
        return dict(_DISCOVERY_ERRORS)


def _reset_for_tests() -> None:
    """Forget everything but the built-ins and allow discovery again (tests only)."""
    global _DISCOVERED
    with _LOCK:
        _REGISTERED.clear()
        _REGISTERED.update({p.name: p for p in BUILTIN_PLUGINS})
        _DISCOVERY_ERRORS.clear()
        _DISCOVERED = False


def _find(pred: Callable[[Plugin], bool], discover_on_miss: bool) -> Plugin | None:
    with _LOCK:
        for p in _REGISTERED.values():
            if pred(p):
                return p
    if not discover_on_miss or _DISCOVERED:
        return None
    discover()
    with _LOCK:
        return next((p for p in _REGISTERED.values() if pred(p)), None)


def list_plugins(discover_entry_points: bool = True) -> list[Plugin]:
    """Every known plug-in descriptor, built-ins first (entry points loaded unless told not to)."""
    if discover_entry_points:
        discover()
    with _LOCK:
        return list(_REGISTERED.values())


def get_plugin(name: str) -> Plugin:
    """The plug-in named ``name``.

    Raises
    ------
    PluginError
        Listing the known plug-ins (and the entry points that failed to load).
    """
    p = _find(lambda q: q.name == name, True)
    if p is None:
        raise PluginError(f"no plug-in named {name!r}; known: {', '.join(q.name for q in list_plugins())}"
                          + _failed_suffix())
    return p


def _failed_suffix() -> str:
    errs = discovery_errors()
    return ("; plug-ins that failed to load: " + "; ".join(errs.values())) if errs else ""


def find_device_type(type_code: int, discover_on_miss: bool = True) -> tuple[Plugin, PluginDevice] | None:
    """The plug-in serving DLPack device type ``type_code`` and its device entry, or None."""
    p = _find(lambda q: any(d.type_code == type_code for d in q.devices), discover_on_miss)
    return None if p is None else (p, next(d for d in p.devices if d.type_code == type_code))


def find_device_name(name: str, discover_on_miss: bool = True) -> tuple[Plugin, PluginDevice] | None:
    """The plug-in whose device is called ``name`` (canonical or alias, any case), or None."""
    low = name.lower()
    p = _find(lambda q: any(low in d.names for d in q.devices), discover_on_miss)
    return None if p is None else (p, next(d for d in p.devices if low in d.names))


def find_loader(type_key: str, discover_on_miss: bool = True) -> Plugin | None:
    """The plug-in that loads modules of ``type_key``, or None."""
    return _find(lambda q: type_key in q.loaders, discover_on_miss)


def find_codegen(kind: str, discover_on_miss: bool = True) -> Plugin | None:
    """The plug-in with a code generator for target kind ``kind``, or None."""
    return _find(lambda q: kind in q.codegens, discover_on_miss)


def import_facet(plugin: Plugin, facet: str, what: str,
                 registered: Callable[[], bool] | None = None) -> ModuleType:
    """Import the module of one facet of ``plugin``; the registry of that facet's layer calls it.

    Parameters
    ----------
    plugin : Plugin
        The descriptor.
    facet : str
        ``"device"``, ``"loader"`` or ``"codegen"``.
    what : str
        What was asked for, for the error message (``"device type 77"``, ``"loader 'fake'"``).
    registered : callable, optional
        Checked after the import: False means the module imported but did not register
        ``what``, which is an error too.

    Returns
    -------
    module

    Raises
    ------
    PluginError
        Naming the plug-in, its origin, the module, ``what`` and the cause (chained).
    """
    modname = plugin.module_for(facet)
    where = f"plug-in {plugin.name!r} ({plugin.origin})"
    if modname is None:
        raise PluginError(f"{where} has no {facet}_module to provide {what}")
    try:
        mod = importlib.import_module(modname)
    except Exception as err:  # noqa: BLE001 - any failure of plug-in code becomes a named PluginError
        raise PluginError(f"{where}: importing {modname} for {what} failed: {type(err).__name__}: {err}") from err
    if registered is not None and not registered():
        raise PluginError(f"{where}: {modname} was imported but did not register {what}")
    return mod


def device_names(discover_entry_points: bool = False) -> dict[str, int]:
    """Every device name and alias the plug-ins declare -> its device type code."""
    return {n: d.type_code for p in list_plugins(discover_entry_points) for d in p.devices for n in d.names}
