"""The shape of a parsed batch: containers over numbered leaves, as one typed tree.

A batch is parsed once; every later step (rebuilding the user's object, naming a field in
an error, checking that two batches can be joined, saving a checkpoint) walks this tree
instead of inspecting the user's values again, so all of them agree on what a field is.

A node keeps its container's type, not the container: the type is all a rebuild needs,
and holding the container would keep the source batch's tensors alive for as long as any
batch cut from it.
"""

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from neuron_sift.data_model.leaves import Leaf, rebuild_sequence
from neuron_sift.exceptions import UnsupportedDataFormatException

Kind = Literal["leaf", "map", "seq"]
# ``BatchStructure.signature()``: nested lists of strings, safe for JSON and for
# ``torch.load(weights_only=True)``.
Signature = list[str | list[Any]]


def rebuild_mapping(container: type, items: dict[Hashable, Any]) -> Mapping[Hashable, Any]:
    """``items`` in a mapping of type ``container`` (e.g. Hugging Face's ``BatchEncoding``).

    Raises:
        UnsupportedDataFormatException: ``container`` cannot be built from a dict; the
            batch is not handed back as a plain dict, which the training loop may not expect.
    """
    if container is dict:
        return items
    try:
        return container(items)
    except Exception as exc:
        raise UnsupportedDataFormatException(
            f"cannot rebuild a batch of type {container} from a dict; pass batch_transforms"
        ) from exc


@dataclass(frozen=True, slots=True)
class BatchStructure:
    """A node of a parsed batch: a leaf, a mapping of named fields, or a sequence of fields.

    Equality and hashing see the kind, keys, children and leaf indices, never the
    container types: they answer whether two batches have the same fields and can be
    joined (the joined batch takes the first one's types), as ``same_shape`` does.

    Attributes:
        kind: ``"leaf"``, ``"map"`` (a ``Mapping`` of fields) or ``"seq"`` (a list/tuple
            of fields).
        container: the type to rebuild a ``"map"`` or ``"seq"`` node as; None for a leaf.
        keys: a ``"map"`` node's keys, in the user's order; empty otherwise.
        children: the nodes of a ``"map"`` (one per key) or ``"seq"`` node.
        index: a leaf's position in the batch's list of leaves; -1 for containers.
    """

    kind: Kind
    container: type | None = field(default=None, compare=False)
    keys: tuple[Hashable, ...] = ()
    children: tuple["BatchStructure", ...] = ()
    index: int = -1
    _paths: tuple[str, ...] | None = field(default=None, init=False, compare=False, repr=False)

    # -- making nodes ---------------------------------------------------------------------

    @staticmethod
    def leaf(index: int) -> "BatchStructure":
        """The leaf at ``index`` of the batch's leaves (one shared node per index)."""
        node = _LEAF_NODES.get(index)
        if node is None:
            node = _LEAF_NODES[index] = BatchStructure("leaf", index=index)
        return node

    @staticmethod
    def mapping(container: type, keys: Sequence[Hashable], children: Sequence["BatchStructure"]) -> "BatchStructure":
        """A ``Mapping`` of type ``container`` whose field ``keys[i]`` is ``children[i]``."""
        if len(keys) != len(children):
            raise ValueError(f"{len(keys)} keys for {len(children)} children")
        return BatchStructure("map", container, tuple(keys), tuple(children))

    @staticmethod
    def sequence(container: type, children: Sequence["BatchStructure"]) -> "BatchStructure":
        """A list/tuple (namedtuple included) of type ``container`` holding ``children``."""
        return BatchStructure("seq", container, (), tuple(children))

    @staticmethod
    def fields(container: type, count: int) -> "BatchStructure":
        """A list/tuple of type ``container`` of ``count`` leaves, the common batch.

        One shared node per (type, count): consecutive batches then have the identical
        structure, and joining them (per source batch) compares by identity.
        """
        key = (container, count)
        node = _FIELDS_NODES.get(key)
        if node is None:
            node = _FIELDS_NODES[key] = BatchStructure.sequence(
                container, [BatchStructure.leaf(i) for i in range(count)]
            )
        return node

    # -- walking the tree -----------------------------------------------------------------

    def build(self, leaves: Sequence[Leaf]) -> Any:
        """The user's object: this tree's containers around the values of ``leaves``."""
        if self.kind == "leaf":
            return leaves[self.index].value
        items = [c.build(leaves) for c in self.children]
        assert self.container is not None, "a container node without its type"
        if self.kind == "map":
            return rebuild_mapping(self.container, dict(zip(self.keys, items)))
        return rebuild_sequence(self.container, items)

    def leaf_paths(self) -> tuple[str, ...]:
        """Each leaf's position in the user's batch (``"['x'][0]"``; ``""`` for the batch
        itself), in leaf order: what errors name so the user can find the field.

        Computed once per node: a batch joined on every source batch asks each time.
        """
        paths = self._paths
        if paths is None:
            found: list[str] = []
            self._collect_paths("", found)
            paths = tuple(found)
            object.__setattr__(self, "_paths", paths)
        return paths

    def _collect_paths(self, prefix: str, out: list[str]) -> None:
        if self.kind == "leaf":
            out.append(prefix)
        elif self.kind == "map":
            for k, c in zip(self.keys, self.children):
                c._collect_paths(f"{prefix}[{k!r}]", out)
        else:
            for i, c in enumerate(self.children):
                c._collect_paths(f"{prefix}[{i}]", out)

    def signature(self) -> Signature:
        """Field names and nesting without types or values: ``["leaf"]``,
        ``["map", [keys as str], [children]]`` or ``["seq", [children]]``.

        Plain lists and strings, so a checkpoint stores it and loads it with
        ``torch.load(weights_only=True)``; its format must not change, or saved
        checkpoints would no longer match the batches they resume.
        """
        if self.kind == "leaf":
            return ["leaf"]
        children = [c.signature() for c in self.children]
        if self.kind == "map":
            return ["map", [str(k) for k in self.keys], children]
        return ["seq", children]

    def same_shape(self, other: "BatchStructure") -> bool:
        """Whether batches of these two structures can be joined: identity first, the
        common case, then equality (same kinds, keys and nesting)."""
        return self is other or self == other


def signature_leaves(signature: Any) -> int | None:
    """How many leaves a ``BatchStructure.signature()`` names (None: not a signature)."""
    if signature == ["leaf"]:
        return 1
    if isinstance(signature, list) and len(signature) == 3 and signature[0] == "map":
        children = signature[2]
    elif isinstance(signature, list) and len(signature) == 2 and signature[0] == "seq":
        children = signature[1]
    else:
        return None
    if not isinstance(children, list):
        return None
    counts = [signature_leaves(c) for c in children]
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


_LEAF_NODES: dict[int, BatchStructure] = {}
_FIELDS_NODES: dict[tuple[type, int], BatchStructure] = {}
