"""Drive the system C compiler to produce shared libraries (standard library only).

The functions here follow TVM's ``fcompile`` protocol so that ``export_library`` can take
either :func:`create_shared` or a :func:`cross_compiler` wrapper:

* ``fcompile(output, files, options=None, **kwargs)`` builds ``output`` from ``files``;
* ``fcompile.output_format`` is the library extension (``"so"``, ``"tar"`` ...);
* ``fcompile.object_format`` (optional) is the extension a DSO module should be saved with
  before compilation (``"o"`` by default, C source modules always save ``"c"``);
* ``fcompile.get_target_triple`` (optional) returns the compiler's target triple.

Nothing here imports NumPy or any compiler dependency: it is used at deploy time to link
``.tar`` libraries on the target machine, which is why it is part of the runtime (users know
it by its TVM name, :mod:`kiln.contrib.cc`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from typing import Any, Callable, Iterable, Sequence

from .errors import CompileError

__all__ = [
    "get_cc",
    "create_shared",
    "compile_object",
    "compile_object_cached",
    "object_cache_key",
    "compiler_version",
    "ObjectCache",
    "fast_linker",
    "create_staticlib",
    "archiver_for",
    "cross_compiler",
    "cross_cc_for_triple",
    "cc_for_modules",
    "DEFAULT_OPTIONS",
]

#: Flags every Kiln library is compiled with unless the caller overrides them (later flags win).
DEFAULT_OPTIONS: tuple[str, ...] = ("-O2", "-fPIC", "-shared", "-std=gnu11")
_LINK_LIBS: tuple[str, ...] = ("-lm", "-lpthread")
_C_EXT = {".c"}
_CXX_EXT = {".cc", ".cpp", ".cxx", ".C"}
_ASM_EXT = {".s", ".S"}


def _include_path() -> str:
    # Imported here, not at module import, so this file stays usable on its own.
    from . import include_path

    return include_path()


def get_cc() -> str:
    """Return the C compiler command to use.

    Honours ``$CC`` (which may carry flags, e.g. ``"ccache gcc"``), else the first of
    ``cc``, ``gcc``, ``clang`` found on ``PATH``.

    Returns
    -------
    str
        A command line prefix; split it with :func:`shlex.split`.

    Raises
    ------
    CompileError
        If no compiler can be found.
    """
    env = os.environ.get("CC")
    if env and env.strip():
        return env.strip()
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    raise CompileError("no C compiler found: set $CC or install gcc/clang")


def _as_list(files: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    if isinstance(files, (str, os.PathLike)):
        return [os.fspath(files)]
    return [os.fspath(f) for f in files]


def _run(cmd: list[str], cwd: str | None) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError as err:
        raise CompileError(f"compiler not found: {cmd[0]!r} ({err})") from err
    if proc.returncode != 0:
        out = proc.stdout.decode("utf-8", "replace")
        exc = CompileError(
            f"compilation failed (exit {proc.returncode}): {shlex.join(cmd)}\n{out}"
        )
        exc.command = cmd  # type: ignore[attr-defined]
        exc.stderr = out  # type: ignore[attr-defined]
        raise exc


def create_shared(
    output: str | os.PathLike,
    objects: str | os.PathLike | Sequence[str | os.PathLike],
    options: Sequence[str] | None = None,
    cc: str | None = None,
    cwd: str | None = None,
    linker: str | None = None,
) -> None:
    """Compile C / C++ / assembly sources and link objects into one shared library.

    Parameters
    ----------
    output : path
        The shared library to write.
    objects : path or list of paths
        ``.c``, ``.cc``/``.cpp``, ``.S``/``.s`` sources and ``.o``/``.a`` inputs.
    options : list of str, optional
        Extra flags, appended after the defaults (so ``-O3`` overrides ``-O2``).
    cc : str, optional
        Compiler command; defaults to :func:`get_cc`.
    cwd : str, optional
        Working directory of the compiler process.
    linker : str, optional
        Link with ``-fuse-ld=<linker>`` (e.g. the result of :func:`fast_linker`); default:
        the compiler's own choice.

    Raises
    ------
    CompileError
        On any compiler failure; the message carries the command line and the compiler's
        output, and the exception has ``.command`` and ``.stderr`` attributes.
    """
    files = _as_list(objects)
    compiler = shlex.split(cc) if cc else shlex.split(get_cc())
    opts = list(options or [])
    inc = ["-I", _include_path()]
    cxx = [f for f in files if os.path.splitext(f)[1] in _CXX_EXT]
    rest = [f for f in files if f not in cxx]
    extra_objs: list[str] = []
    if cxx:
        # C++ needs its own -std; compile those to objects next to the output first.
        out_dir = os.path.dirname(os.path.abspath(os.fspath(output)))
        for i, src in enumerate(cxx):
            obj = os.path.join(out_dir, f".kiln_cxx_{i}_{os.path.basename(src)}.o")
            _run(compiler + ["-O2", "-fPIC", "-std=c++17", *inc, *opts, "-c", src, "-o", obj], cwd)
            extra_objs.append(obj)
    cmd = compiler + list(DEFAULT_OPTIONS) + inc + opts + ([f"-fuse-ld={linker}"] if linker else [])
    cmd += ["-o", os.fspath(output)]
    cmd += rest + extra_objs + list(_LINK_LIBS)
    if cxx:
        cmd.append("-lstdc++")
    try:
        _run(cmd, cwd)
    finally:
        for obj in extra_objs:
            try:
                os.remove(obj)
            except OSError:
                pass


create_shared.output_format = "so"  # type: ignore[attr-defined]
create_shared.object_format = "o"  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------
# object cache (per process, optionally persistent) and linker choice (used by export_library)
# ------------------------------------------------------------------------------------
_cache_lock = threading.Lock()
_object_cache: dict[tuple[str, ...], str] = {}
_object_locks: dict[tuple[str, ...], threading.Lock] = {}
_object_dir: tuple[int, str] | None = None  # (owning pid, directory)
_linker_cache: dict[tuple[str, ...], str | None] = {}
_version_cache: dict[tuple[str, ...], str | None] = {}
_header_digests: dict[str, str] = {}

#: The persistent object cache protocol: ``object_cache(key, ext, produce) -> path or None``.
#: ``key`` is a SHA-256 hex digest of everything that determines the object (see
#: :func:`compile_object_cached`), ``ext`` the file extension (``"o"``), ``produce(path)``
#: compiles the object to ``path``. The cache returns the path of a valid entry (building it
#: with ``produce`` on a miss), or ``None`` when it is disabled or unusable (the caller then
#: compiles privately). The runtime implements no persistent cache itself: the compiler side
#: passes :func:`kiln.codegen.cache.cached_object` (``docs/kernels.md``, "Compile cache").
ObjectCache = Callable[[str, str, Callable[[str], None]], str | None]

#: Options that read files the key cannot see (include directories, forced includes, another
#: sysroot, compiler specs, response files): with one of them the object is not persisted.
_UNKEYED_OPTION_PREFIXES = ("-I", "-isystem", "-iquote", "-idirafter", "-iprefix", "-iwithprefix", "-include",
                            "-imacros", "--include", "--sysroot", "-isysroot", "-B", "-specs", "--specs",
                            "-fplugin", "-Xclang", "@")

#: Linkers tried by :func:`fast_linker`, fastest first. Linking a 98 MiB library (ResNet-50
#: weights in the blob section, build id given on the command line) took 0.27-0.45 s with GNU
#: ld and 0.15-0.19 s with gold on a loaded 2-core machine.
FAST_LINKERS: tuple[str, ...] = ("gold",)


def _remove_object_dir(pid: int, path: str) -> None:
    # A forked child inherits this handler; only the process that made the directory removes it.
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


def _private_object_dir() -> str:
    global _object_dir
    if _object_dir is None or _object_dir[0] != os.getpid() or not os.path.isdir(_object_dir[1]):
        # After a fork the parent's directory may vanish when the parent exits: make our own.
        _object_cache.clear()
        path = tempfile.mkdtemp(prefix="kiln_objects_")
        _object_dir = (os.getpid(), path)
        atexit.register(_remove_object_dir, os.getpid(), path)
    return _object_dir[1]


def compiler_version(compiler: Sequence[str]) -> str | None:
    """First line of ``<compiler> --version`` (memoised per process), or ``None`` if it fails."""
    key = tuple(compiler)
    with _cache_lock:
        if key in _version_cache:
            return _version_cache[key]
    try:
        proc = subprocess.run([*compiler, "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=30)
        lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
        got = lines[0].strip() if proc.returncode == 0 and lines else None
    except (OSError, subprocess.SubprocessError):
        got = None
    with _cache_lock:
        _version_cache[key] = got
    return got


def _headers_digest(inc: str) -> str:
    """SHA-256 over every file under the Kiln include directory (memoised per process)."""
    with _cache_lock:
        got = _header_digests.get(inc)
    if got is not None:
        return got
    h = hashlib.sha256()
    for root, dirs, files in os.walk(inc):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                data = f.read()
            for field in (os.path.relpath(p, inc).encode("utf-8", "surrogateescape"), data):
                h.update(len(field).to_bytes(8, "little"))
                h.update(field)
    got = h.hexdigest()
    with _cache_lock:
        _header_digests[inc] = got
    return got


def object_cache_key(compiler: Sequence[str], flags: Sequence[str], source: str, content: bytes) -> str | None:
    """The persistent cache key of ``compiler flags -c source`` (SHA-256 hex), or ``None``.

    Covers the Kiln version, the machine, the compiler command, its resolved path and the
    first line of its ``--version``, every flag, the source's path and content, and the
    content of every Kiln header (the include directory). ``None`` when the object must not
    be persisted: the compiler's version cannot be read, or a flag reads files the key
    cannot see (:data:`_UNKEYED_OPTION_PREFIXES`, other than the Kiln include directory).
    """
    from .._version import __version__

    inc = _include_path()
    i = 0
    while i < len(flags):
        if flags[i] == "-I" and i + 1 < len(flags) and flags[i + 1] == inc:
            i += 2  # the Kiln include directory: its headers are in the key
            continue
        if flags[i].startswith(_UNKEYED_OPTION_PREFIXES):
            return None
        i += 1
    version = compiler_version(compiler)
    if version is None:
        return None
    resolved = shutil.which(compiler[0]) if compiler else None
    h = hashlib.sha256()
    fields: list[str | bytes] = ["kiln-object-v1", __version__, platform.machine(), shlex.join(compiler),
                                 os.path.realpath(resolved) if resolved else "", version, shlex.join(flags),
                                 source, hashlib.sha256(content).hexdigest(), _headers_digest(inc)]
    for field in fields:
        b = field.encode("utf-8", "surrogateescape") if isinstance(field, str) else field
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _object_flags(options: Sequence[str] | None) -> list[str]:
    """The flags :func:`create_shared` would compile a C source with, for ``-c``."""
    return [o for o in DEFAULT_OPTIONS if o != "-shared"] + ["-I", _include_path()] + list(options or [])


def compile_object(
    source: str | os.PathLike,
    output: str | os.PathLike,
    options: Sequence[str] | None = None,
    cc: str | None = None,
) -> str:
    """Compile one C source to the object ``output``, with the flags :func:`create_shared` uses.

    Linking the object is equivalent to passing the source to :func:`create_shared`.

    Returns
    -------
    str
        ``output``.

    Raises
    ------
    CompileError
        If the compiler fails.
    """
    compiler = shlex.split(cc) if cc else shlex.split(get_cc())
    out = os.fspath(output)
    _run(compiler + _object_flags(options) + ["-c", os.path.abspath(os.fspath(source)), "-o", out], None)
    return out


def compile_object_cached(
    source: str | os.PathLike,
    options: Sequence[str] | None = None,
    cc: str | None = None,
    object_cache: ObjectCache | None = None,
) -> str:
    """Compile one C source to an object file, once per process per (compiler, options, source).

    ``export_library`` links the Kiln crt and the C API driver into every library; compiling
    each once and reusing the object saves a C compile (0.15-0.7 s) per export. The object is
    compiled with the flags :func:`create_shared` would use for it (``DEFAULT_OPTIONS``
    without ``-shared``, the Kiln include path, then ``options``), so linking it is
    equivalent to passing the source.

    With ``object_cache`` (the :data:`ObjectCache` protocol, e.g. the on-disk compile cache
    the compiler side passes), the object also outlives the process: on a first use in a
    process the cache is asked for the entry :func:`object_cache_key` names, and only
    compiles when it has no valid one. Several threads may compile different sources at once.

    Parameters
    ----------
    source : path
        A ``.c`` file. Its content is part of the key; so are the Kiln headers when the
        object is persisted (within a process they ship with the package and do not change).
    options : list of str, optional
        Extra flags, as given to :func:`create_shared` (linker-only flags are ignored by
        ``-c``).
    cc : str, optional
        Compiler command; defaults to :func:`get_cc`.
    object_cache : callable, optional
        Persistent cache (:data:`ObjectCache`); default: this process only.

    Returns
    -------
    str
        Path of the object, in a private directory removed at exit. Do not modify it.

    Raises
    ------
    CompileError
        If the compiler fails (the caller may fall back to passing the source).
    """
    compiler = shlex.split(cc) if cc else shlex.split(get_cc())
    opts = list(options or [])
    src = os.path.abspath(os.fspath(source))
    with open(src, "rb") as f:
        content = f.read()
    digest = hashlib.sha256(content).hexdigest()
    flags = _object_flags(opts)
    key = (*compiler, "\0", *flags, "\0", src, digest)
    with _cache_lock:
        d = _private_object_dir()
        hit = _object_cache.get(key)
        if hit is not None and os.path.isfile(hit):
            return hit
        lock = _object_locks.setdefault(key, threading.Lock())
    with lock:  # one compile per key even when several threads export at once
        with _cache_lock:
            hit = _object_cache.get(key)
            if hit is not None and os.path.isfile(hit):
                return hit
        name = hashlib.sha256("\n".join(key).encode("utf-8", "surrogateescape")).hexdigest()[:24]
        obj = os.path.join(d, f"{name}.o")
        tmp = obj + ".tmp.o"

        def produce(out: str) -> None:
            _run(compiler + flags + ["-c", src, "-o", out], None)

        entry = None
        if object_cache is not None:
            pkey = object_cache_key(compiler, flags, src, content)
            if pkey is not None:
                try:
                    entry = object_cache(pkey, "o", produce)
                except OSError:
                    entry = None  # an unusable cache: compile privately
        if entry is not None:
            # A private copy: the entry may be evicted (or replaced) while this process links.
            shutil.copyfile(entry, tmp)
        else:
            produce(tmp)
        os.replace(tmp, obj)  # never leave a half-written object under the final name
        with _cache_lock:
            _object_cache[key] = obj
        return obj


def fast_linker(cc: str | None = None) -> str | None:
    """The fastest linker of :data:`FAST_LINKERS` that ``cc`` can drive, or ``None``.

    Probed once per process and compiler (``cc -fuse-ld=<name> -Wl,--version``, a few
    milliseconds). Worth it only for large links: linking a library whose blob holds
    100 MB of weights is mostly copying bytes, which gold does faster than GNU ld.

    Parameters
    ----------
    cc : str, optional
        Compiler command; defaults to :func:`get_cc`.

    Returns
    -------
    str or None
        A value for ``create_shared(..., linker=...)``.
    """
    compiler = shlex.split(cc) if cc else shlex.split(get_cc())
    key = tuple(compiler)
    with _cache_lock:
        if key in _linker_cache:
            return _linker_cache[key]
    found: str | None = None
    for name in FAST_LINKERS:
        try:
            proc = subprocess.run(compiler + [f"-fuse-ld={name}", "-Wl,--version"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        # "GNU gold", "LLD": the probe must name the linker, not just exit 0 through a wrapper.
        if proc.returncode == 0 and name.encode() in proc.stdout.lower():
            found = name
            break
    with _cache_lock:
        _linker_cache[key] = found
    return found


def create_staticlib(output: str | os.PathLike, inputs: Sequence[str | os.PathLike], ar: str | None = None) -> None:
    """Archive object files into a static library with ``ar rcs``.

    Raises
    ------
    CompileError
        If ``ar`` fails or is missing.
    """
    tool = ar or os.environ.get("AR") or "ar"
    _run(shlex.split(tool) + ["rcs", os.fspath(output), *_as_list(inputs)], None)


create_staticlib.output_format = "a"  # type: ignore[attr-defined]


def archiver_for(cc: str | None) -> str | None:
    """The ``ar`` that goes with a compiler: ``aarch64-linux-gnu-gcc`` -> ``aarch64-linux-gnu-ar``.

    ``None`` (use ``$AR`` or ``ar``) for a compiler without a target prefix or whose prefixed
    ``ar`` is not installed.
    """
    if not cc:
        return None
    prog = os.path.basename(shlex.split(cc)[0])
    for suffix in ("-gcc", "-clang", "-cc"):
        if prog.endswith(suffix) and len(prog) > len(suffix):
            tool = prog[: -len(suffix)] + "-ar"
            return tool if shutil.which(tool) else None
    return None


def _triple_of(compiler: str) -> Callable[[], str | None]:
    def get_target_triple() -> str | None:
        try:
            proc = subprocess.run(
                shlex.split(compiler) + ["-dumpmachine"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
        except OSError:
            return None
        return proc.stdout.decode().strip() or None

    return get_target_triple


def cross_compiler(
    compile_func: str | Callable[..., Any],
    options: Sequence[str] | None = None,
    output_format: str | None = None,
    get_target_triple: Callable[[], str | None] | None = None,
    add_files: Sequence[str] | None = None,
) -> Callable[..., None]:
    """Wrap a compiler (command name or fcompile function) with fixed options and files.

    Parameters
    ----------
    compile_func : str or callable
        A compiler command such as ``"aarch64-linux-gnu-gcc"`` (used through
        :func:`create_shared`) or an fcompile function.
    options : list of str, optional
        Options prepended to the ones given at call time.
    output_format : str, optional
        Library extension; defaults to ``compile_func.output_format`` or ``"so"``.
    get_target_triple : callable, optional
        Returns the target triple; derived from ``<cc> -dumpmachine`` for command names.
    add_files : list of str, optional
        Extra sources/objects added to every build.

    Returns
    -------
    callable
        ``fcompile(output, objects, options=None, **kwargs)`` with ``.output_format``,
        ``.object_format`` and ``.get_target_triple`` attributes.
    """
    base_opts = list(options or [])
    extra = list(add_files or [])
    if isinstance(compile_func, str):
        cc_cmd = compile_func

        def run_compile(output: Any, objects: Any, options: Any = None, **kw: Any) -> None:
            kw.setdefault("cc", cc_cmd)
            create_shared(output, objects, options, **kw)

        fmt_default, obj_default = "so", "o"
        triple: Callable[[], str | None] | None = get_target_triple or _triple_of(cc_cmd)
    else:
        run_compile = compile_func
        fmt_default = getattr(compile_func, "output_format", "so")
        obj_default = getattr(compile_func, "object_format", "o")
        triple = get_target_triple or getattr(compile_func, "get_target_triple", None)

    def fcompile(output: Any, objects: Any, options: Sequence[str] | None = None, **kwargs: Any) -> None:
        all_opts = base_opts + list(options or [])
        run_compile(output, _as_list(objects) + extra, options=all_opts, **kwargs)

    fcompile.output_format = output_format or fmt_default  # type: ignore[attr-defined]
    fcompile.object_format = obj_default  # type: ignore[attr-defined]
    fcompile.get_target_triple = triple  # type: ignore[attr-defined]
    return fcompile


# ------------------------------------------------------------------------------------
# cross compilers: which C compiler links code for another machine (docs/cross_compile.md)
# ------------------------------------------------------------------------------------
#: Vendor fields a triple may carry that the GNU toolchains' names leave out
#: (``aarch64-unknown-linux-gnu`` is Debian's ``aarch64-linux-gnu-gcc``).
_VENDORS = frozenset({"unknown", "pc", "none"})
#: Spellings of one CPU architecture in triples and ``platform.machine()``.
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
#: Debian / Ubuntu package that brings the cross compiler, per architecture (for the error).
_CROSS_PACKAGES = {"aarch64": "gcc-aarch64-linux-gnu", "riscv64": "gcc-riscv64-linux-gnu",
                   "arm": "gcc-arm-linux-gnueabihf", "x86_64": "gcc-x86-64-linux-gnu",
                   "powerpc64le": "gcc-powerpc64le-linux-gnu", "s390x": "gcc-s390x-linux-gnu"}


def _triple_arch(triple: str) -> str:
    arch = triple.strip().lower().split("-")[0]
    return _ARCH_ALIASES.get(arch, arch)


def _gnu_triple(triple: str) -> str:
    """``arch-os-env`` as GNU cross toolchains are named: vendor dropped, arch normalised."""
    parts = triple.strip().lower().split("-")
    parts[0] = _ARCH_ALIASES.get(parts[0], parts[0])
    if len(parts) >= 4 or (len(parts) == 3 and parts[1] in _VENDORS):
        parts = [parts[0]] + [p for p in parts[1:] if p not in _VENDORS]
    return "-".join(parts)


def _dumpmachine(compiler: str) -> str | None:
    try:
        proc = subprocess.run(shlex.split(compiler) + ["-dumpmachine"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "replace").strip() or None


def cross_cc_for_triple(triple: str | None) -> str | None:
    """The C compiler that links code built for ``triple``, or ``None`` for this machine's.

    A triple of this machine's architecture (or none) needs no cross compiler: ``None`` lets
    :func:`get_cc` choose as always. For another architecture the candidates, in order, are
    ``$CC`` when it is already a compiler for that architecture (``$CC -dumpmachine``), then
    ``<triple>-gcc`` and ``<arch>-<os>-<env>-gcc`` (the triple without its vendor, how
    Debian, Ubuntu and Fedora name their cross compilers: ``aarch64-linux-gnu-gcc``,
    ``riscv64-linux-gnu-gcc``), found on ``PATH``.

    Parameters
    ----------
    triple : str or None
        An LLVM target triple such as ``"aarch64-linux-gnu"`` or
        ``"riscv64-unknown-linux-gnu"``.

    Returns
    -------
    str or None
        A compiler command for :func:`create_shared` (``cc=``), or ``None`` for the host's.

    Raises
    ------
    CompileError
        If the triple is another machine's and no compiler for it is installed; the message
        names the compilers looked for and the package that provides one.
    """
    if not triple or not triple.strip():
        return None
    arch = _triple_arch(triple)
    if arch == _ARCH_ALIASES.get(platform.machine().lower(), platform.machine().lower()):
        return None
    env = os.environ.get("CC", "").strip()
    if env:
        found = _dumpmachine(env)
        if found is not None and _triple_arch(found) == arch:
            return env
    candidates = _dedupe_names([f"{triple.strip()}-gcc", f"{_gnu_triple(triple)}-gcc"])
    for name in candidates:
        if shutil.which(name):
            return name
    hint = _CROSS_PACKAGES.get(arch)
    raise CompileError(
        f"no C compiler for target triple {triple!r} (this machine is {platform.machine()}): looked for "
        f"{', '.join(candidates)} on PATH"
        + (f"; install one (Debian/Ubuntu: apt-get install {hint})" if hint else "")
        + ", set $CC to a compiler for it, or pass cc= to export_library"
    )


def _dedupe_names(names: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(names))


def cc_for_modules(modules: Iterable[Any]) -> str | None:
    """The compiler :func:`cross_cc_for_triple` picks for the triple of ``modules``' code.

    A module that knows which machine its code is for has a ``target_triple()`` method
    (:class:`kiln.codegen.llvm_module.LLVMModule`); modules without one are left out.

    Returns
    -------
    str or None
        A cross compiler command, or ``None`` when the code is for this machine.

    Raises
    ------
    CompileError
        If the modules name different architectures, or no compiler for theirs is installed.
    """
    triples: dict[str, str] = {}
    for m in modules:
        fn = getattr(m, "target_triple", None)
        triple = fn() if callable(fn) else None
        if triple:
            triples.setdefault(_triple_arch(triple), triple)
    if len(triples) > 1:
        raise CompileError(f"one library holds code for one machine; the modules target "
                           f"{', '.join(sorted(triples.values()))}")
    return cross_cc_for_triple(next(iter(triples.values()))) if triples else None
