"""Safetensors headers are read as strictly as the safetensors library reads them (issue 20, item 5).

The reference is the library itself (safetensors 0.8.0, safetensors/src/tensor.rs: `read_metadata`,
the `Metadata` deserialisation, `Metadata::validate`): every malformed shard below is first shown
to be refused by `safetensors.safe_open`, so the expectation is the library's, not ours. Then
mxconvert's own reader (`read_header`, `ShardReader`) must refuse it with an `InputError` that names
the file, the tensor and what was expected; `convert` of a checkpoint holding it must exit 2 and
write nothing; `verify` of an artifact whose source shard became it must exit 2 on the header
(not 0, and not 1 on the changed hash: the header is read first).

Shards are written byte by byte (`_shard_bytes`), so a header can say what no writer would: dims as
`2.0`, `"2"`, `true` or `-0`, repeated keys, NaN, lone surrogate escapes. Each malformation is a
function of a valid shard (its header as a dict, its data) so the same case applies to a small
hand-made shard and to a shard of the example checkpoint.

Where mxconvert is stricter than the library on purpose (a repeated key, a field other than
dtype/shape/data_offsets, a shape no array can hold) a test says so and shows the library accepts.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLE, run_cli, tree_digest
from safetensors import SafetensorError, safe_open

from mxconvert.core.dtypes import ST_ITEMSIZE, from_safetensors
from mxconvert.core.errors import InputError
from mxconvert.storage.safetensors_header import read_header
from mxconvert.storage.safetensors_io import ShardReader, StreamingWriter

LIMIT = 100_000_000  # safetensors' MAX_HEADER_SIZE
U64 = 2**64
#: safetensors dtype code by mxconvert dtype name, for every dtype mxconvert reads
ST_CODE = {from_safetensors(code): code for code in ST_ITEMSIZE}


# ---- writing shards byte by byte ---------------------------------------------------------------------
class Raw(str):
    """A JSON token written as is (`2.0`, `-0`, `NaN`, `"\\ud800"`)."""


class Pairs(list):
    """A JSON object written from (key, value) pairs, so a key can repeat; a key may be `Raw`."""


def _json(value) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{_json_key(k)}:{_json(v)}" for k, v in value) + "}"
    if isinstance(value, dict):
        return _json(Pairs(value.items()))
    if isinstance(value, list):
        return "[" + ",".join(_json(v) for v in value) + "]"
    return json.dumps(value)


def _json_key(key: str) -> str:
    return str(key) if isinstance(key, Raw) else json.dumps(key)


def _shard_bytes(header, data: bytes, *, pad: bool = True) -> bytes:
    """A safetensors file: 8-byte length, header (a value for `_json`, or bytes as they are), data.
    `pad`: spaces up to a multiple of 8, as the library writes them."""
    text = header if isinstance(header, bytes) else _json(header).encode()
    if pad and not isinstance(header, bytes):
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _split(path: Path) -> tuple[dict, bytes]:
    """(header as a dict in file order, data) of a valid shard."""
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


#: The small hand-made shard every case starts from: several dtypes, a scalar, a zero-size tensor.
SMALL_HEADER = {
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "b": {"dtype": "U8", "shape": [4], "data_offsets": [24, 28]},
    "c": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [28, 32]},
    "s": {"dtype": "I16", "shape": [], "data_offsets": [32, 34]},
    "z": {"dtype": "U8", "shape": [0], "data_offsets": [34, 34]},
}
SMALL_DATA = bytes(range(34))


def _library_error(path: Path) -> str | None:
    """The safetensors library's refusal of `path` (opening it checks the whole header), or None."""
    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except SafetensorError as exc:
        return str(exc)
    return None


def _ours_error(path: Path) -> str | None:
    try:
        read_header(path)
    except InputError as exc:
        return str(exc)
    return None


# ---- malformations: (header dict, data) -> (header, data) --------------------------------------------
def _tensors(header: dict) -> list[str]:
    """Tensor names in data order."""
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])


def _first(header: dict, dims: int = 1) -> str:
    """The first tensor (in data order) with at least `dims` dims, all of them above 1."""
    return next(k for k in _tensors(header) if len(header[k]["shape"]) >= dims and min(header[k]["shape"]) > 1)


def _set(header: dict, name: str, field: str, value) -> dict:
    out = json.loads(json.dumps(header))
    out[name][field] = value
    return out


def _shape(change: Callable[[list], list], dims: int = 1):
    def mutate(header, data):
        name = _first(header, dims)
        return _set(header, name, "shape", change(list(header[name]["shape"]))), data

    return mutate


def _offsets(change: Callable[[list], list]):
    def mutate(header, data):
        name = _tensors(header)[0]
        return _set(header, name, "data_offsets", change(list(header[name]["data_offsets"]))), data

    return mutate


def _shift(header: dict, names: list[str], by: int) -> dict:
    out = json.loads(json.dumps(header))
    for name in names:
        out[name]["data_offsets"] = [x + by for x in out[name]["data_offsets"]]
    return out


def _gap(header, data):
    """8 unlisted bytes between the first two tensors; the later ones move on (their bytes unchanged)."""
    names = _tensors(header)
    cut = header[names[0]]["data_offsets"][1]
    return _shift(header, names[1:], 8), data[:cut] + bytes(8) + data[cut:]


def _gap_at_start(header, data):
    return _shift(header, _tensors(header), 8), bytes(8) + data


def _overlap(header, data):
    """The second tensor starts where the first does (the sizes still match the shapes)."""
    first, second = _tensors(header)[:2]
    by = header[first]["data_offsets"][0] - header[second]["data_offsets"][0]
    return _shift(header, [second], by), data


def _zero_size_beyond_end(header, data):
    out = json.loads(json.dumps(header))
    out["zero.beyond.end"] = {"dtype": "U8", "shape": [0], "data_offsets": [len(data) + 8, len(data) + 8]}
    return out, data


def _overflow(shape):
    def mutate(header, data):
        out = json.loads(json.dumps(header))
        out["too.many.elements"] = {"dtype": "U8", "shape": shape, "data_offsets": [len(data), len(data)]}
        return out, data

    return mutate


def _metadata(value):
    def mutate(header, data):
        out = json.loads(json.dumps(header))
        out["__metadata__"] = value
        return out, data

    return mutate


def _pairs(change: Callable[[list], list]):
    """Rewrite the header as (key, value) pairs, so keys can repeat or be raw tokens."""

    def mutate(header, data):
        return Pairs(change(list(header.items()))), data

    return mutate


def _entry_pairs(change: Callable[[list], list]):
    def mutate(header, data):
        name = _tensors(header)[0]
        out = dict(header)
        out[name] = Pairs(change(list(header[name].items())))
        return out, data

    return mutate


def _rename_first(key: Raw):
    return _pairs(lambda items: [(key, v) if k == _tensors(dict(items))[0] else (k, v) for k, v in items])


def _header_bytes(change: Callable[[bytes], bytes]):
    def mutate(header, data):
        return change(_json(header).encode()), data

    return mutate


#: (id, malformation, words our message must hold). Every one is refused by the safetensors library.
MALFORMED = [
    ("dim-float", _shape(lambda s: [Raw(f"{s[0]}.0"), *s[1:]]), ["shape", "non-negative integers", ".0"]),
    ("dim-exponent", _shape(lambda s: [Raw(f"{s[0]}e0"), *s[1:]]), ["shape", "non-negative integers", "e0"]),
    ("dim-string", _shape(lambda s: [str(s[0]), *s[1:]]), ["shape", "non-negative integers"]),
    ("dim-bool", _shape(lambda s: [True, *s]), ["shape", "non-negative integers", "True"]),
    ("dims-negative", _shape(lambda s: [-s[0], -s[1], *s[2:]], dims=2), ["shape", "non-negative integers", "-"]),
    ("dim-minus-zero", _shape(lambda s: [*s, Raw("-0")]), ["shape", "non-negative integers", "-0"]),
    ("dim-null", _shape(lambda s: [None, *s[1:]]), ["shape", "non-negative integers", "None"]),
    ("dim-nan", _shape(lambda s: [Raw("NaN"), *s[1:]]), ["NaN is not JSON"]),
    ("dim-2-to-64", _shape(lambda s: [U64, *s[1:]]), ["shape", "non-negative integers"]),
    ("dim-5000-digits", _shape(lambda s: [Raw("1" * 5000), *s[1:]]), ["shape", "non-negative integers"]),
    ("shape-string", _shape(lambda s: "".join(map(str, s))), ["shape", "non-negative integers"]),
    ("shape-null", _shape(lambda s: None), ["shape", "non-negative integers"]),
    ("shape-size-mismatch", _shape(lambda s: [s[0] + 1, *s[1:]]), ["inconsistent", "needs", "offsets give"]),
    ("shape-overflows-u64", _overflow([2**32, 2**32, 0]), ["too.many.elements", "64-bit"]),
    ("offset-minus-zero", _offsets(lambda o: [Raw("-0"), o[1]]), ["data_offsets", "non-negative integers", "-0"]),
    ("offset-false", _offsets(lambda o: [False, o[1]]), ["data_offsets", "non-negative integers", "False"]),
    ("offset-float", _offsets(lambda o: [o[0], Raw(f"{o[1]}.0")]), ["data_offsets", "non-negative integers"]),
    ("offset-string", _offsets(lambda o: [o[0], str(o[1])]), ["data_offsets", "non-negative integers"]),
    ("offsets-three", _offsets(lambda o: [*o, o[1]]), ["data_offsets", "[begin, end]"]),
    ("offsets-object", _offsets(lambda o: {"begin": o[0], "end": o[1]}), ["data_offsets", "[begin, end]"]),
    ("offsets-reversed", _offsets(lambda o: [o[1], o[0]]), ["data_offsets", "end before they begin"]),
    ("offsets-overlap", _overlap, ["data_offsets", "overlaps"]),
    ("offsets-gap", _gap, ["data_offsets", "gap of 8 bytes"]),
    ("offsets-gap-at-start", _gap_at_start, ["data_offsets", "gap of 8 bytes after the start of the data"]),
    ("zero-size-beyond-end", _zero_size_beyond_end, ["zero.beyond.end", "data_offsets", "gap"]),
    ("trailing-bytes", lambda h, d: (h, d + bytes(8)), ["8 bytes follow the data of tensor"]),
    ("no-tensor-listed-but-data", lambda h, d: ({"__metadata__": {"format": "pt"}}, d), ["lists no tensor"]),
    ("truncated-data", lambda h, d: (h, d[:-1]), ["truncated", "ends at byte"]),
    ("metadata-int", _metadata({"format": "pt", "n": 1}), ["__metadata__", "strings to strings", "'n': 1"]),
    ("metadata-null-value", _metadata({"format": None}), ["__metadata__", "strings to strings"]),
    ("metadata-object-value", _metadata({"format": {"x": "y"}}), ["__metadata__", "strings to strings"]),
    ("metadata-bool-value", _metadata({"format": True}), ["__metadata__", "strings to strings"]),
    ("metadata-list", _metadata(["format", "pt"]), ["__metadata__", "object of strings"]),
    ("metadata-string", _metadata("pt"), ["__metadata__", "object of strings"]),
    ("metadata-lone-surrogate", _metadata({"format": Raw('"\\ud800"')}), ["__metadata__", "strings to strings"]),
    ("metadata-twice", _pairs(lambda items: [("__metadata__", {"format": "pt"}), *items]), ["appears twice"]),
    ("name-lone-surrogate", _rename_first(Raw('"x\\udc00"')), ["not valid Unicode text"]),
    ("field-twice", _entry_pairs(lambda items: [*items, items[0]]), ["appears twice"]),
    (
        "field-missing",
        _entry_pairs(lambda items: [(k, v) for k, v in items if k != "data_offsets"]),
        ["entry must be an object of exactly", "data_offsets"],
    ),
    (
        "entry-null",
        _pairs(lambda items: [(k, None if i == 1 else v) for i, (k, v) in enumerate(items)]),
        ["entry must be an object"],
    ),
    (
        "entry-list",
        _pairs(lambda items: [(k, [] if i == 1 else v) for i, (k, v) in enumerate(items)]),
        ["entry must be an object"],
    ),
    (
        "dtype-lowercase",
        _entry_pairs(lambda items: [(k, "bf16" if k == "dtype" else v) for k, v in items]),
        ["unsupported dtype 'bf16'", "expected one of"],
    ),
    (
        "dtype-number",
        _entry_pairs(lambda items: [(k, 1 if k == "dtype" else v) for k, v in items]),
        ["unsupported dtype 1"],
    ),
    ("top-level-list", lambda h, d: ([h], d), ["not a JSON object"]),
    ("header-trailing-nul", _header_bytes(lambda b: b + b"\x00"), ["corrupt safetensors header", "Extra data"]),
    ("header-trailing-garbage", _header_bytes(lambda b: b + b"}"), ["corrupt safetensors header", "Extra data"]),
    ("header-bom", _header_bytes(lambda b: b"\xef\xbb\xbf" + b), ["corrupt safetensors header"]),
    ("header-not-utf8", _header_bytes(lambda b: b.replace(b'"pt"', b'"p\xff"')), ["corrupt safetensors header"]),
    ("header-control-char", _header_bytes(lambda b: b.replace(b'"pt"', b'"p\x01"')), ["Invalid control character"]),
    ("header-nested-deep", _header_bytes(lambda b: b"[" * 100_000 + b"]" * 100_000), ["nested too deeply"]),
    ("header-empty", _header_bytes(lambda b: b""), ["corrupt safetensors header"]),
]
MALFORMED_IDS = [case[0] for case in MALFORMED]


def _write_case(path: Path, header: dict, data: bytes, mutate) -> Path:
    new_header, new_data = mutate(header, data)
    path.write_bytes(_shard_bytes(new_header, new_data))
    return path


@pytest.mark.parametrize("case, mutate, words", MALFORMED, ids=MALFORMED_IDS)
def test_a_shard_the_library_refuses_is_refused_by_the_reader(tmp_path, case, mutate, words):
    path = _write_case(tmp_path / "small.safetensors", SMALL_HEADER, SMALL_DATA, mutate)
    assert _library_error(path) is not None, f"{case}: the safetensors library accepts it"
    for read in (read_header, ShardReader):
        with pytest.raises(InputError) as err:
            read(path)
        message = str(err.value)
        assert message.startswith(f"{path}: "), message
        for word in words:
            assert word in message, (word, message)


def test_the_cases_start_from_a_shard_both_readers_accept(tmp_path):
    """The base of every case is valid: what the cases change is what is refused."""
    path = tmp_path / "small.safetensors"
    path.write_bytes(_shard_bytes(SMALL_HEADER, SMALL_DATA))
    assert _library_error(path) is None
    tensors, metadata = read_header(path)
    assert metadata == {"format": "pt"}
    assert {k: (t.dtype, t.shape, t.begin, t.end) for k, t in tensors.items()} == {
        "a": ("float32", (2, 3), 0, 24),
        "b": ("uint8", (4,), 24, 28),
        "c": ("bfloat16", (1, 2), 28, 32),
        "s": ("int16", (), 32, 34),
        "z": ("uint8", (0,), 34, 34),
    }


def test_a_header_over_the_library_limit_is_refused_before_it_is_read(tmp_path):
    """100,000,000 bytes (decimal) is the library's limit, not 100 MiB: a header of 100,000,001 bytes
    is refused by length alone (the file is sparse; neither reader reads the header)."""
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", LIMIT + 1))
        f.truncate(8 + LIMIT + 1)
    assert "too large" in _library_error(path)
    with pytest.raises(InputError, match=rf"{LIMIT + 1} bytes, more than the {LIMIT}"):
        read_header(path)


@pytest.mark.parametrize(
    "blob, words",
    [
        (b"\x00" * 7, ["not a safetensors file", "7 bytes"]),
        (struct.pack("<Q", 64) + b"{}", ["truncated", "claims 64 bytes"]),
        (struct.pack("<Q", U64 - 1) + b"{}", ["more than the"]),
    ],
    ids=["shorter-than-8-bytes", "header-past-the-end", "header-length-u64-max"],
)
def test_a_length_field_the_library_refuses_is_refused(tmp_path, blob, words):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    assert _library_error(path) is not None
    with pytest.raises(InputError) as err:
        read_header(path)
    for word in [str(path), *words]:
        assert word in str(err.value), (word, str(err.value))


# ---- stricter than the library, on purpose -----------------------------------------------------------
STRICTER = [
    ("tensor-name-twice-same-entry", _pairs(lambda items: [*items, items[1]]), "appears twice"),
    ("metadata-key-twice", _metadata(Pairs([("format", "np"), ("format", "pt")])), "appears twice"),
    ("entry-extra-field", _entry_pairs(lambda items: [*items, ("x", 1)]), "entry must be an object of exactly"),
    ("shape-no-array-can-hold", _overflow([0, 2**32, 2**32]), "64-bit"),
]


@pytest.mark.parametrize("case, mutate, words", STRICTER, ids=[c[0] for c in STRICTER])
def test_where_we_are_stricter_than_the_library_it_is_on_purpose(tmp_path, case, mutate, words):
    """The library keeps the last of a repeated tensor name or metadata key (which one a reader
    keeps is ambiguous), ignores unknown entry fields, and passes a shape whose 0 dim comes first
    (no array can be made of it: numpy refuses). We refuse each; the library's acceptance is shown
    so this list stays honest."""
    path = _write_case(tmp_path / "small.safetensors", SMALL_HEADER, SMALL_DATA, mutate)
    assert _library_error(path) is None
    with pytest.raises(InputError, match=words):
        read_header(path)


# ---- headers the library accepts are accepted ----------------------------------------------------------
def _without_metadata(header: dict) -> dict:
    return {k: v for k, v in header.items() if k != "__metadata__"}


def _reversed_fields(header: dict) -> dict:
    return {k: (v if k == "__metadata__" else dict(reversed(list(v.items())))) for k, v in header.items()}


def _renamed(header: dict, old: str, new: str) -> Pairs:
    return Pairs([(new if k == old else k, v) for k, v in header.items()])


ZERO_SIZE_AT_0 = {
    "y": {"dtype": "F64", "shape": [3, 0], "data_offsets": [0, 0]},
    "x": {"dtype": "U8", "shape": [0, 5], "data_offsets": [0, 0]},
}
ZERO_SIZE_AT_24 = {"m": {"dtype": "I32", "shape": [0], "data_offsets": [24, 24]}}

#: (id, the file from the small shard's (header, data)). Every one is accepted by the library.
VALID = [
    ("as-the-library-writes", lambda h, d: _shard_bytes(h, d)),
    ("no-metadata", lambda h, d: _shard_bytes(_without_metadata(h), d)),
    ("metadata-null", lambda h, d: _shard_bytes({**h, "__metadata__": None}, d)),
    ("metadata-empty", lambda h, d: _shard_bytes({**h, "__metadata__": {}}, d)),
    ("metadata-unicode", lambda h, d: _shard_bytes({**h, "__metadata__": {"é": "\U0001f600", "": ""}}, d)),
    ("metadata-last", lambda h, d: _shard_bytes({**_without_metadata(h), "__metadata__": {"format": "pt"}}, d)),
    ("entries-in-reverse-order", lambda h, d: _shard_bytes(dict(reversed(list(h.items()))), d)),
    ("fields-in-another-order", lambda h, d: _shard_bytes(_reversed_fields(h), d)),
    ("header-unpadded", lambda h, d: _shard_bytes(h, d, pad=False)),
    (
        "whitespace-around-and-inside",
        lambda h, d: _shard_bytes(b" \n\t\r" + json.dumps(h, indent=2).encode() + b"\r", d),
    ),
    ("escaped-name", lambda h, d: _shard_bytes(_renamed(h, "a", Raw('"\\u0061"')), d)),
    ("surrogate-pair-name", lambda h, d: _shard_bytes(_renamed(h, "b", Raw('"\\ud83d\\ude00"')), d)),
    ("empty-name", lambda h, d: _shard_bytes(_renamed(h, "b", ""), d)),
    ("zero-size-tensors-at-one-offset", lambda h, d: _shard_bytes({**h, **ZERO_SIZE_AT_0}, d)),
    ("zero-size-tensor-between-others", lambda h, d: _shard_bytes({**h, **ZERO_SIZE_AT_24}, d)),
    ("no-tensors", lambda h, d: _shard_bytes({"__metadata__": {"format": "pt"}}, b"")),
    ("nothing-at-all", lambda h, d: _shard_bytes({}, b"")),
    ("every-dtype-mxconvert-reads", lambda h, d: _every_dtype_shard()),
]


def _every_dtype_shard() -> bytes:
    header, offset = {}, 0
    for code, size in sorted(ST_ITEMSIZE.items()):
        header[code.lower()] = {"dtype": code, "shape": [2, 1], "data_offsets": [offset, offset + 2 * size]}
        offset += 2 * size
    return _shard_bytes(header, bytes(offset))


@pytest.mark.parametrize("case, build", VALID, ids=[c[0] for c in VALID])
def test_a_header_the_library_accepts_is_accepted_and_read_alike(tmp_path, case, build):
    path = tmp_path / "valid.safetensors"
    path.write_bytes(build(SMALL_HEADER, SMALL_DATA))
    assert _library_error(path) is None, case
    tensors, metadata = read_header(path)
    _assert_read_alike(path, tensors, metadata)


def _assert_read_alike(path: Path, tensors: dict, metadata: dict) -> None:
    """Our header says what the library's does: names, shapes, dtypes, metadata, and the bytes."""
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        assert (f.metadata() or {}) == metadata
        reader = ShardReader(path)
        for name, info in tensors.items():
            view = f.get_slice(name)
            assert (view.get_shape(), view.get_dtype()) == (list(info.shape), ST_CODE[info.dtype]), name
            expected = f.get_tensor(name).reshape(-1).view(torch.uint8).numpy().tobytes()
            assert reader.get_bytes(name) == expected, name
        reader.close()


# ---- property-style: random valid headers, random damage -----------------------------------------------
def _random_shard(rng: random.Random) -> tuple[dict, bytes]:
    codes = sorted(ST_CODE.values())
    entries = []
    for i in range(rng.randint(0, 6)):
        code = rng.choice(codes)
        shape = [rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.randint(0, 3))]
        entries.append((f"t{i}.{rng.choice(['w', 'b', 'é', 'x y'])}", code, shape))
    rng.shuffle(entries)
    header: dict = {}
    if rng.random() < 0.5:
        header["__metadata__"] = {"format": rng.choice(["pt", "np", ""])}
    offset = 0
    for name, code, shape in entries:
        nbytes = math.prod(shape) * ST_ITEMSIZE[code]
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    items = list(header.items())
    rng.shuffle(items)
    return dict(items), bytes(rng.randrange(256) for _ in range(offset))


def test_random_valid_headers_are_accepted_and_read_as_the_library_reads_them(tmp_path):
    rng = random.Random(20)
    for i in range(60):
        header, data = _random_shard(rng)
        path = tmp_path / f"valid-{i}.safetensors"
        path.write_bytes(_shard_bytes(header, data, pad=rng.random() < 0.5))
        assert _library_error(path) is None, header
        tensors, metadata = read_header(path)
        _assert_read_alike(path, tensors, metadata)


#: Where a refusal of ours without one of the library's is expected (the STRICTER cases above).
_STRICTER_WORDS = ("appears twice", "entry must be an object of exactly", "64-bit", "unsupported dtype")
#: Values a damaged header puts where a dim, an offset, a dtype, a metadata value or an entry was.
_TOKENS = [
    *("-0", "0", "1", "2", "8", "-1", "-2", "2.0", "1e0", "0.5", "true", "false", "null", "NaN", "Infinity"),
    *("[]", "[0]", "[1,2]", "[0,0]", "{}", '"2"', '""', '"pt"', '"U8"', '"F4"', '"\\ud800"', '"\\ud83d\\ude00"'),
    *(str(2**64 - 1), str(2**64)),
]


def _places(value, path=()):
    """Every place in a header (a path of keys and indices) a value can be replaced at."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _places(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _places(item, (*path, index))


def _replaced(value, path, new):
    if not path:
        return new
    out = dict(value) if isinstance(value, dict) else list(value)
    out[path[0]] = _replaced(value[path[0]], path[1:], new)
    return out


def _damaged(rng: random.Random) -> tuple[bytes, bytes]:
    """(header bytes, data) of a random valid shard with one random damage: a value replaced by a
    token, an entry or field repeated or dropped, bytes added or removed, or one character of the
    JSON changed."""
    header, data = _random_shard(rng)
    kind = rng.choice(["token", "token", "token", "repeat", "drop", "data", "char"])
    if kind == "token":
        places = [p for p in _places(header) if p]
        header = _replaced(header, rng.choice(places), Raw(rng.choice(_TOKENS))) if places else header
    elif kind in ("repeat", "drop") and header:
        items = list(header.items())
        at = rng.randrange(len(items))
        name, entry = items[at]
        if isinstance(entry, dict) and entry and rng.random() < 0.5:  # a field of the entry
            fields = list(entry.items())
            field = rng.randrange(len(fields))
            fields = [*fields, fields[field]] if kind == "repeat" else fields[:field] + fields[field + 1 :]
            items[at] = (name, Pairs(fields))
        else:
            items = [*items, items[at]] if kind == "repeat" else items[:at] + items[at + 1 :]
        header = Pairs(items)
    elif kind == "data":
        cut = rng.randrange(len(data) + 1)
        data = data[:cut] + bytes(rng.randint(1, 9)) + data[cut:] if rng.random() < 0.5 else data[:cut]
    text = bytearray(_json(header).encode())
    if kind == "char":
        at = rng.randrange(len(text))
        text[at : at + 1] = rng.choice('0-.e"{}[],: \\').encode()
    return bytes(text), data


def test_randomly_damaged_headers_the_library_refuses_are_refused(tmp_path):
    """600 random damages of random valid shards (fixed seed): every file the library refuses we
    refuse; every one it accepts we accept, unless one of the stricter rules above says why."""
    rng = random.Random(20)
    outcomes = {"both refuse": 0, "both accept": 0, "only we refuse": 0}
    for i in range(600):
        header, data = _damaged(rng)
        path = tmp_path / f"damaged-{i}.safetensors"
        path.write_bytes(_shard_bytes(header, data))
        library, ours = _library_error(path), _ours_error(path)
        if library is not None:
            assert ours is not None, (header, len(data), library)
            outcomes["both refuse"] += 1
        elif ours is None:
            _assert_read_alike(path, *read_header(path))
            outcomes["both accept"] += 1
        else:
            assert any(word in ours for word in _STRICTER_WORDS), (header, ours)
            outcomes["only we refuse"] += 1
        path.unlink()
    assert min(outcomes.values()) >= 10, outcomes  # the damage exercises every outcome


# ---- the writer writes what the library reads --------------------------------------------------------
@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt", "mxconvert": "é \U0001f600"}])
def test_what_the_streaming_writer_writes_the_library_reads(tmp_path, metadata):
    tensors = {
        "w.bf16": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4),
        "w.u8": torch.arange(5, dtype=torch.uint8),
        "w.scalar": torch.tensor(2.5, dtype=torch.float32),
        "w.empty": torch.empty(0, 3, dtype=torch.float16),
        "w.fp8": torch.zeros(2, 2, dtype=torch.float8_e4m3fn),
        "w.i64": torch.tensor([-1, 7], dtype=torch.int64),
        "naïve name": torch.ones(1, dtype=torch.float64),
    }
    path = tmp_path / "written.safetensors"
    writer = StreamingWriter(path, [(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()], metadata)
    for name, value in tensors.items():
        writer.write(name, value)
    writer.close()
    assert _library_error(path) is None
    with safe_open(str(path), framework="pt") as f:
        assert (f.metadata() or {}) == (metadata or {})
        for name, value in tensors.items():
            assert torch.equal(f.get_tensor(name).reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8))
    read, meta = read_header(path)
    assert sorted(read) == sorted(tensors) and meta == (metadata or {})


@pytest.mark.parametrize(
    "specs, metadata",
    [
        ([("a", "uint8", (2,)), ("a", "uint8", (2,))], None),
        ([("__metadata__", "uint8", (2,))], None),
        ([("x\udc00", "uint8", (2,))], None),
        ([("a", "uint8", (True, 2))], None),
        ([("a", "uint8", (-1, -2))], None),
        ([("a", "uint8", (2,))], {"format": 1}),
    ],
    ids=["name-twice", "reserved-name", "lone-surrogate", "bool-dim", "negative-dims", "metadata-number"],
)
def test_the_writer_refuses_to_write_a_header_the_library_would_refuse(tmp_path, specs, metadata):
    """A bug upstream fails before a byte is written (an internal error, not an artifact vLLM refuses)."""
    path = tmp_path / "never.safetensors"
    with pytest.raises(AssertionError):
        StreamingWriter(path, specs, metadata)
    assert not path.exists()


# ---- the CLI: convert refuses such a checkpoint, verify such a source ---------------------------------
def _example_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the example checkpoint and its first shard (the one the cases damage)."""
    ckpt = tmp_path / "model"
    shutil.copytree(EXAMPLE, ckpt, symlinks=True)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    return ckpt, ckpt / sorted(set(index["weight_map"].values()))[0]


def _damage(shard: Path, mutate) -> None:
    header, data = _split(shard)
    _write_case(shard, header, data, mutate)
    assert _library_error(shard) is not None


def _refused_naming(result, shard: Path, words: list[str]) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    text = result.stderr
    assert "Traceback" not in text and "internal error" not in text, text
    assert text.startswith("error:") and text.strip().count("\n") == 0, text
    for word in [shard.name, *words]:
        assert word in text, (word, text)


@pytest.mark.parametrize("case, mutate, words", MALFORMED, ids=MALFORMED_IDS)
def test_convert_of_a_checkpoint_holding_such_a_shard_is_exit_2_and_writes_nothing(tmp_path, case, mutate, words):
    ckpt, shard = _example_copy(tmp_path)
    _damage(shard, mutate)
    before = tree_digest(ckpt)
    result = run_cli("convert", ckpt, "--profile", "h100", "-o", tmp_path / "out")
    _refused_naming(result, shard, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no OUT, no staging beside it
    assert tree_digest(ckpt) == before


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The example converted from a copy of it (verify finds the source by the path it records)."""
    root = tmp_path_factory.mktemp("converted")
    ckpt, _ = _example_copy(root)
    result = run_cli("convert", ckpt, "--profile", "h100", "-o", root / "art")
    assert result.exit_code == 0, result.stderr
    return root


@pytest.mark.parametrize("case, mutate, words", MALFORMED, ids=MALFORMED_IDS)
def test_verify_of_an_artifact_whose_source_shard_is_such_a_shard_fails_on_its_header(
    converted, tmp_path, case, mutate, words
):
    """The source is read before any hash is compared, so the header is what fails (exit 2), not
    the changed hash (exit 1): a malformed shard never counts as the source an artifact proves."""
    ckpt, shard = _example_copy(tmp_path)
    _damage(shard, mutate)
    result = run_cli("verify", converted / "art", "--source", ckpt)
    _refused_naming(result, shard, words)


def test_verify_of_the_undamaged_copy_passes(converted, tmp_path):
    """The verify cases above fail because of the damage alone."""
    ckpt, _ = _example_copy(tmp_path)
    result = run_cli("verify", converted / "art", "--source", ckpt)
    assert result.exit_code == 0, (result.stdout, result.stderr)


def test_the_example_shards_are_valid_for_both_readers():
    for shard in sorted(EXAMPLE.glob("*.safetensors")):
        assert _library_error(shard) is None
        tensors, metadata = read_header(shard)
        _assert_read_alike(shard, tensors, metadata)


def test_the_case_writer_writes_the_tokens_it_is_given():
    """`-0` and `2.0` are no integers to the library, and Python's json would read them as 0 and 2.0:
    the cases above write them as tokens, as their names say."""
    assert _json({"s": [Raw("-0"), Raw("2.0"), True, None]}) == '{"s":[-0,2.0,true,null]}'
    assert _json(Pairs([("k", 1), ("k", 2)])) == '{"k":1,"k":2}'
