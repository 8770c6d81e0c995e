"""Every function of the IR's public surface, in one namespace (re-exported by ``tg``)."""

from types import ModuleType as _ModuleType

from tensor_graphs.ir.builder import (  # noqa: F401
    add,
    arange,
    as_node,
    broadcast_to,
    cast,
    cat,
    concat,
    constant,
    copy_to,
    equal,
    erf,
    exp,
    expand,
    flatten,
    gather,
    getitem,
    input,
    iota,
    less,
    log,
    matmul,
    max,
    maximum,
    mul,
    neg,
    pad,
    permute,
    pow,
    promote,
    reciprocal,
    reshape,
    sin,
    size,
    slice_axis,
    sqrt,
    squeeze,
    state,
    state_update,
    sum,
    transpose,
    unsqueeze,
    weight,
    where,
)
from tensor_graphs.ir.ops import atomic  # noqa: F401  (registers the atomic ops)
from tensor_graphs.ir.ops.conv import *  # noqa: F401,F403,E402
from tensor_graphs.ir.ops.elementwise import (  # noqa: F401
    abs,
    clamp,
    cos,
    div,
    elu,
    gelu,
    greater,
    greater_equal,
    isnan,
    less_equal,
    logical_and,
    logical_not,
    logical_or,
    minimum,
    not_equal,
    relu,
    rsqrt,
    selu,
    sigmoid,
    sign,
    silu,
    softplus,
    square,
    sub,
    tanh,
)
from tensor_graphs.ir.ops.gradient import *  # noqa: F401,F403,E402
from tensor_graphs.ir.ops.losses import *  # noqa: F401,F403,E402
from tensor_graphs.ir.ops.nn import *  # noqa: F401,F403,E402
from tensor_graphs.ir.ops.pointwise import *  # noqa: F401,F403,E402
from tensor_graphs.ir.ops.quant import *  # noqa: F401,F403,E402
from tensor_graphs.ir.ops.random import *  # noqa: F401,F403,E402
from tensor_graphs.ir.ops.recurrent import *  # noqa: F401,F403,E402
from tensor_graphs.ir.ops.reductions import (  # noqa: F401
    argmax,
    argmin,
    cumsum,
    log_softmax,
    logsumexp,
    mean,
    min,
    prod,
    softmax,
    var,
)
from tensor_graphs.ir.ops.selection import *  # noqa: F401,F403,E402
from tensor_graphs.ir.ops.shape_ops import *  # noqa: F401,F403,E402

__all__ = [name for name, value in dict(globals()).items()
           if not name.startswith("_") and not isinstance(value, _ModuleType)]
