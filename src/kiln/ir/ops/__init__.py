"""Built-in IR operators. Importing this package registers all of them.

See ``docs/ir.md`` for the table of op names, attributes and fusion patterns.
"""

from . import elemwise, nn, reduce, transform  # noqa: F401
from . import layout  # noqa: F401  (blocked layouts: layout_transform, conv2d_nchwc, max_pool2d_nchwc)
from . import attention, index, integer, loss, recurrent, spatial  # noqa: F401
from . import dynamic  # noqa: F401  (data-dependent output extents: nonzero, unique, NMS, ...)
from . import ml  # noqa: F401  (constant-table kernels: ngram_count, tree_ensemble)
from . import control  # noqa: F401  (runtime if / loop, run by the executor)
from . import strings  # noqa: F401  (string ops, run by the executor as host ops)
from . import winograd  # noqa: F401  (Winograd F(2x2,3x3): input / output transforms, GEMMs)
from .reduce import normalize_axes
from .transform import normalize_slice
from .nn import resize_source_coord

__all__ = ["normalize_axes", "normalize_slice", "resize_source_coord"]
