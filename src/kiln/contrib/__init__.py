"""Tools around the core: C compiler drivers, tar packaging."""
