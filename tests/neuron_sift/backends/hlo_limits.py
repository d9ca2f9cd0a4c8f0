"""Neuron compiler limits, checked on HLO text (torch-xla's graphs before XLA's own passes).

Each pattern is one that Neuron documents as failing or miscompiling:
- TopK on integer inputs (NCC_EVRF013); a sort of integer keys is flagged too, since the
  compiler may rewrite a sort followed by a slice into a TopK (aws-neuron-sdk issue 1339);
- TopK with k above 16384 (NCC_EVRF014), and any sort of a dimension longer than 16384
  (the same rewrite gives a TopK with k equal to the whole dimension);
- scatter with an arithmetic combiner on integers (EVRF016 errors, EVRF060 computes in f32);
- 64-bit integer constants outside the int32 range (neuronx-cc up to 2.32 narrows int64
  to int32 by default).
Boolean-mask assignment (aws-neuron-sdk issue 1381) leaves no single HLO pattern; the
probe checks torch-xla's op counters for it instead (``MASK_OPS``).
"""

import re
from dataclasses import dataclass

MAX_TOPK = 16384
INT32_MAX = 2**31 - 1
INT_TYPES = ("s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "pred")
# torch-xla op counters that mean a boolean-mask read or assignment was traced.
MASK_OPS = (
    "xla::index_put_",
    "xla::index_put",
    "xla::masked_scatter",
    "xla::masked_scatter_",
    "xla::masked_select",
    "xla::nonzero",
    "xla::_index_put_impl_",
)

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_SHAPE = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")


@dataclass
class Instr:
    name: str
    type: str
    opcode: str
    operands: list[str]
    attrs: str
    root: bool
    raw: str  # the text between the opcode's parentheses


@dataclass
class Finding:
    module: str
    rule: str
    detail: str


def _split_type(rest: str) -> tuple[str, str]:
    """``'(s64[2], s32[2]) sort(...)'`` -> (type, remainder)."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[: i + 1], rest[i + 1 :].lstrip()
    t, _, r = rest.partition(" ")
    return t, r


def _parse_instr(line: str):
    m = _INSTR.match(line)
    if not m:
        return None
    type_, rest = _split_type(m.group(3))
    opcode, _, args = rest.partition("(")
    depth, end = 1, 0
    for i, ch in enumerate(args):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            end = i
            break
    operands = [o.strip().split(" ")[-1].lstrip("%") for o in args[:end].split(",") if o.strip()]
    return Instr(m.group(2), type_, opcode.strip(), operands, args[end + 1 :], bool(m.group(1)), args[:end])


def parse_module(text: str) -> dict[str, list[Instr]]:
    """Computation name -> its instructions."""
    comps: dict[str, list[Instr]] = {}
    current = None
    for line in text.splitlines():
        h = _HEADER.match(line)
        if h and "=" not in line.split("(")[0]:
            current = comps.setdefault(h.group(2), [])
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is not None:
            ins = _parse_instr(line)
            if ins is not None:
                current.append(ins)
    return comps


def _shapes(type_: str) -> list[tuple[str, list[int]]]:
    return [(t, [int(d) for d in dims.split(",") if d]) for t, dims in _SHAPE.findall(type_)]


def _attr(attrs: str, name: str) -> str:
    m = re.search(name + r"=\{?([^},]*)", attrs)
    return m.group(1) if m else ""


def check_module(name: str, text: str) -> list[Finding]:
    comps = parse_module(text)
    roots = {c: next((i for i in instrs if i.root), None) for c, instrs in comps.items()}
    out: list[Finding] = []
    for instrs in comps.values():
        for ins in instrs:
            shapes = _shapes(ins.type)
            if ins.opcode == "sort" and shapes:
                key_type, dims = shapes[0]
                dim = int(_attr(ins.attrs, "dimensions") or 0)
                if key_type in INT_TYPES:
                    out.append(Finding(name, "sort of integers", f"%{ins.name} {ins.type}"))
                if dims and dims[dim] > MAX_TOPK:
                    out.append(Finding(name, f"sort longer than {MAX_TOPK}", f"%{ins.name} {ins.type}"))
            topk = ins.opcode == "topk" or (ins.opcode == "custom-call" and "TopK" in ins.attrs)
            if topk and shapes:
                key_type, dims = shapes[0]
                k = int(_attr(ins.attrs, "k") or (dims[-1] if dims else 0))
                if key_type in INT_TYPES:
                    out.append(Finding(name, "TopK on integers", f"%{ins.name} {ins.type}"))
                if k > MAX_TOPK:
                    out.append(Finding(name, f"TopK with k > {MAX_TOPK}", f"%{ins.name} k={k}"))
            if ins.opcode == "scatter" and shapes and shapes[0][0] in INT_TYPES:
                combiner = roots.get(_attr(ins.attrs, "to_apply").lstrip("%"))
                if combiner is None or combiner.opcode != "parameter":
                    op = combiner.opcode if combiner is not None else "unknown"
                    out.append(Finding(name, "integer scatter with arithmetic combiner", f"%{ins.name} ({op})"))
            if ins.opcode == "constant" and shapes and shapes[0][0] in ("s64", "u64"):
                values = [int(v) for v in re.findall(r"-?\d+", ins.raw)]
                big = [v for v in values if not -INT32_MAX - 1 <= v <= INT32_MAX]
                if big:
                    out.append(Finding(name, "int64 constant outside int32", f"%{ins.name} = {big[:3]}"))
    return out
