"""`--max-shard-size` values: sizes as the tools around mxconvert write them (docs/usage.md,
"Output files"), in bytes."""

from __future__ import annotations

import re
from decimal import Decimal

from mxconvert.core.errors import InputError

#: `--max-shard-size` units, lower case (docs/usage.md): decimal K/M/G/T (with or without B) are
#: powers of 1000, binary Ki/Mi/Gi/Ti (with or without B) powers of 1024; none or B is bytes.
SIZE_UNITS = {
    "": 1,
    "b": 1,
    **{p: 1000**n for n, p in enumerate("kmgt", 1)},
    **{p + "b": 1000**n for n, p in enumerate("kmgt", 1)},
    **{p + "i": 1024**n for n, p in enumerate("kmgt", 1)},
    **{p + "ib": 1024**n for n, p in enumerate("kmgt", 1)},
}
SIZE_FORMS = (
    "a whole number of bytes, or a number with a unit: 5G, 500M, 1.5G, 4GB (powers of 1000) or 5GiB, "
    "500MiB, 5Gi (powers of 1024), in any case"
)
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def parse_size(text: str) -> int:
    """`--max-shard-size`: bytes from `5G`, `500M`, `4GB`, `1.5G` (powers of 1000), `5GiB`, `500MiB`,
    `5Gi` (powers of 1024) or plain bytes, in any case, as the tools around it write sizes
    (huggingface_hub's `4GB`, `du`/`numfmt`'s `5G`, Kubernetes' `5Gi`). Anything else is refused
    naming the accepted forms, and so is a size below one byte; a fraction of a byte is rounded down."""
    found = _SIZE.fullmatch(text.strip().lower())
    if found is None or found[2] not in SIZE_UNITS:
        raise InputError(f"--max-shard-size {text!r}: expected {SIZE_FORMS}")
    value = int(Decimal(found[1]) * SIZE_UNITS[found[2]])  # whole bytes, rounded down: 0.6MiB is 629145
    if value <= 0:
        raise InputError("--max-shard-size must be positive")
    return value
