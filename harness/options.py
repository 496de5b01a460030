"""Options in a server's argument list, found as the engines' parsers find them.

Both engines' parsers (argparse) take `--flag value` and `--flag=value`, and `_` for `-` in long
flags; the last use of a flag wins. Every reader of server_args (the backend flags, the parallel
sizes, the harness's own --port/--host/--api-key) goes through `option_uses`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class OptionUse:
    flag: str  # the dashed spelling (`--api_key=V` -> `--api-key`)
    value: str | None  # None: no value follows the flag; "" from `--flag=`
    index: int  # where the flag is in the list
    inline: bool  # `--flag=value`, one item

    @property
    def items(self) -> range:
        """The list positions this use takes: the flag, and its value when that is the next item."""
        return range(self.index, self.index + (1 if self.inline or self.value is None else 2))


def flag_of(arg: str) -> str:
    """The flag `arg` names, in its dashed spelling; short flags (`-tp`) are kept as written."""
    head = arg.partition("=")[0]
    return head.replace("_", "-") if head.startswith("--") else head


def option_uses(args: Sequence[str], flags: Collection[str]) -> list[OptionUse]:
    """Each use of one of `flags` (dashed spellings) in `args`, in order. A next item that starts
    with `--` is the following flag, not this one's value."""
    uses: list[OptionUse] = []
    taken = -1  # a value item of the previous use is no flag of its own
    for i, arg in enumerate(args):
        if i == taken or flag_of(arg) not in flags:
            continue
        _, eq, tail = arg.partition("=")
        if eq:
            uses.append(OptionUse(flag_of(arg), tail, i, inline=True))
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            uses.append(OptionUse(flag_of(arg), args[i + 1], i, inline=False))
            taken = i + 1
        else:
            uses.append(OptionUse(flag_of(arg), None, i, inline=False))
    return uses
