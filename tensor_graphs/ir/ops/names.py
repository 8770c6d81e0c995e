"""Every built-in op's name as a constant of the op table.

Code that asks which op a node is compares against these (``node.op.name == MATMUL``,
``n.op.name in (WEIGHT, CONSTANT)``), never against a string literal: a misspelt constant fails
at import (``from ... import MATMULL``) or at lint (ruff F821), where a misspelt string compared
False forever. tests/test_op_names.py keeps this table equal to the ops ``import tensor_graphs``
registers, and refuses a string literal compared with an op's name anywhere in the package.

An op is named where it is defined (a leaf or atomic op in ``ir/ops/atomic.py``, a composite
after its function); this table mirrors those names, so a new op adds its line here too.
"""

# leaves: the graph's values that no op computes
INPUT = "input"
WEIGHT = "weight"
STATE = "state"
CONSTANT = "constant"
DIM = "dim"

# atomic ops: each has one numpy reference (atomic.py)
NEG = "neg"
EXP = "exp"
LOG = "log"
SQRT = "sqrt"
RECIPROCAL = "reciprocal"
SIN = "sin"
ERF = "erf"
ADD = "add"
MUL = "mul"
MAXIMUM = "maximum"
POW = "pow"
EQUAL = "equal"
LESS = "less"
WHERE = "where"
CAST = "cast"
SUM = "sum"
MAX = "max"
RESHAPE = "reshape"
PERMUTE = "permute"
EXPAND = "expand"
SLICE = "slice"
PAD = "pad"
CONCAT = "concat"
GATHER = "gather"
MATMUL = "matmul"
IOTA = "iota"
COPY_TO = "copy_to"
STATE_UPDATE = "state_update"
ARGSORT = "argsort"
SCATTER = "scatter"

# composites, each defined by its decomposition: elementwise.py
SUB = "sub"
DIV = "div"
LOGICAL_NOT = "logical_not"
LOGICAL_AND = "logical_and"
LOGICAL_OR = "logical_or"
GREATER = "greater"
LESS_EQUAL = "less_equal"
GREATER_EQUAL = "greater_equal"
NOT_EQUAL = "not_equal"
ISNAN = "isnan"
MINIMUM = "minimum"
ABS = "abs"
SIGN = "sign"
SQUARE = "square"
RSQRT = "rsqrt"
COS = "cos"
CLAMP = "clamp"
RELU = "relu"
SIGMOID = "sigmoid"
TANH = "tanh"
GELU = "gelu"
SILU = "silu"
ELU = "elu"
SELU = "selu"
SOFTPLUS = "softplus"

# reductions.py
MEAN = "mean"
VAR = "var"
MIN = "min"
ARGMAX = "argmax"
ARGMIN = "argmin"
PROD = "prod"
CUMSUM = "cumsum"
LOGSUMEXP = "logsumexp"
SOFTMAX = "softmax"
LOG_SOFTMAX = "log_softmax"

# shape_ops.py
TRIU = "triu"
TRIL = "tril"
TILE = "tile"

# nn.py
LAYER_NORM = "layer_norm"
RMS_NORM = "rms_norm"
LINEAR = "linear"
EMBEDDING = "embedding"
SCALED_DOT_PRODUCT_ATTENTION = "scaled_dot_product_attention"
ROTARY_EMBEDDING = "rotary_embedding"

# losses.py
MSE_LOSS = "mse_loss"
L1_LOSS = "l1_loss"
NLL_LOSS = "nll_loss"
CROSS_ENTROPY = "cross_entropy"
KL_DIV = "kl_div"

# conv.py
CONV2D = "conv2d"
MAX_POOL2D = "max_pool2d"
AVG_POOL2D = "avg_pool2d"
ADAPTIVE_AVG_POOL2D = "adaptive_avg_pool2d"
INTERPOLATE = "interpolate"
BATCH_NORM = "batch_norm"
GROUP_NORM = "group_norm"

# selection.py (sort, topk and the scatter family build on argsort and scatter)
TAKE_ALONG_AXIS = "take_along_axis"
PUT_ALONG_AXIS = "put_along_axis"
INDEX_COPY = "index_copy"
CUMPROD = "cumprod"
ANY = "any"
ALL = "all"
