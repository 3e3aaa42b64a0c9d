"""Shell completion scripts for ``stratad``, generated from its argument parser.

``stratad ctl completion bash|zsh|fish`` prints a static script: the command
tree (subcommands, their options, which options take a value, and the
choices of those that have them) is read from the argparse parser now and
written into the script, so completing never runs Python (no start-up delay
at every Tab) and the script cannot drift from the parser it was made from.
Completion therefore knows commands and options, not the daemon's session
or checkpoint IDs. The parser is the one the ``stratad`` command parsed the
command line with, handed down by `stratad.cli` (ctl sits below the command
that contains it, so it never imports it).

Each script finds the command path typed so far (``ctl sessions``), skipping
options and their values wherever they appear (the global options are
accepted after the subcommand too), then offers that path's subcommands, its
options after a ``-``, an option's choices after the option, or file names.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field

from stratad.ctl.parser import SHELLS


@dataclass
class Node:
    """One command of the tree: what may follow it."""

    path: str
    subcommands: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    #: Options that take a value, with their choices ([] = any value).
    valued: dict[str, list[str]] = field(default_factory=dict)
    #: Choices of its positional argument, if it has any (``completion SHELL``).
    positional_choices: list[str] = field(default_factory=list)
    #: The help of each subcommand and option (fish shows them).
    help: dict[str, str] = field(default_factory=dict)


def command_tree(parser: argparse.ArgumentParser) -> list[Node]:
    """Every command of ``parser``, the root first, depth first; paths are the
    words typed (``stratad ctl sessions``): never empty, as a bash key must not be."""
    nodes: list[Node] = []
    _walk(parser, parser.prog, nodes)
    return nodes


def _walk(
    parser: argparse.ArgumentParser,
    path: str,
    nodes: list[Node],
    inherited: dict[str, str] | None = None,
) -> None:
    """``inherited``: the help of the options above ``parser``, for the global
    options a subcommand repeats with their help suppressed (ctl/parser.py)."""
    inherited = inherited or {}
    node = Node(path)
    nodes.append(node)
    children: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, child in action.choices.items():
                node.subcommands.append(name)
                node.help[name] = helps.get(name, "")
                children.append((name, child))
        elif action.option_strings:
            node.options.extend(action.option_strings)
            for option in action.option_strings:
                shown = action.help != argparse.SUPPRESS
                node.help[option] = (action.help if shown else inherited.get(option)) or ""
                if action.nargs != 0:
                    node.valued[option] = [str(c) for c in action.choices or ()]
        elif action.choices:
            node.positional_choices.extend(str(c) for c in action.choices)
    for name, child in children:
        _walk(child, f"{path} {name}", nodes, {**inherited, **node.help})


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (bash, zsh or fish), of the whole
    ``stratad`` command as ``parser`` (`stratad.cli_parser.build_parser`) parses it."""
    nodes = command_tree(parser)
    writers = {"bash": _bash, "zsh": _zsh, "fish": _fish}
    if shell not in writers:
        raise ValueError(f"no completion for {shell!r}: one of {', '.join(SHELLS)}")
    return writers[shell](nodes)


def _q(text: str) -> str:
    return shlex.quote(text)


# --- bash (also what zsh's own script is modelled on) ------------------------------


def _tables(nodes: list[Node], declare: str) -> list[str]:
    """Associative arrays: subcommands and options by path; valued options and choices
    by ``path|option`` (``path|`` for the positional's choices)."""
    subs = [f"  [{_q(n.path)}]={_q(' '.join(n.subcommands))}" for n in nodes]
    opts = [f"  [{_q(n.path)}]={_q(' '.join(n.options))}" for n in nodes]
    choices = []
    for n in nodes:
        for option, allowed in n.valued.items():
            choices.append(f"  [{_q(n.path + '|' + option)}]={_q(' '.join(allowed) or ':any')}")
        if n.positional_choices:
            choices.append(f"  [{_q(n.path + '|')}]={_q(' '.join(n.positional_choices))}")
    return [
        f"{declare} _stratad_subs=(",
        *subs,
        ")",
        f"{declare} _stratad_opts=(",
        *opts,
        ")",
        f"{declare} _stratad_values=(",
        *choices,
        ")",
    ]


_BASH_FUNCTION = r"""
# The command path typed before the word being completed, in _stratad_path;
# _stratad_want_value=1 when that word is the value of an option.
_stratad_scan() {
  local i w
  _stratad_path=stratad
  _stratad_want_value=0
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    if ((_stratad_want_value)); then
      _stratad_want_value=0
    elif [[ $w == -* ]]; then
      [[ -n ${_stratad_values["$_stratad_path|$w"]+set} && $w != *=* ]] && _stratad_want_value=1
    elif [[ " ${_stratad_subs[$_stratad_path]} " == *" $w "* ]]; then
      _stratad_path="$_stratad_path $w"
    fi
  done
}

_stratad() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]} words
  _stratad_scan
  if ((_stratad_want_value)); then
    words=${_stratad_values["$_stratad_path|$prev"]}
    if [[ $words == :any ]]; then
      COMPREPLY=($(compgen -f -- "$cur"))
    else
      COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
  elif [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "${_stratad_opts[$_stratad_path]}" -- "$cur"))
  else
    words="${_stratad_subs[$_stratad_path]} ${_stratad_values["$_stratad_path|"]}"
    if [[ -n ${words// /} ]]; then
      COMPREPLY=($(compgen -W "$words" -- "$cur"))
    else
      COMPREPLY=($(compgen -f -- "$cur"))
    fi
  fi
}

complete -F _stratad stratad
"""


def _bash(nodes: list[Node]) -> str:
    header = [
        "# bash completion for stratad; generated by `stratad ctl completion bash`.",
        "# Load it: source <(stratad ctl completion bash)",
    ]
    return "\n".join([*header, *_tables(nodes, "declare -gA")]) + "\n" + _BASH_FUNCTION


_ZSH_FUNCTION = r"""
_stratad() {
  local i w path=stratad want=0 cur=${words[CURRENT]} prev=${words[CURRENT-1]} choices
  for ((i = 2; i < CURRENT; i++)); do
    w=${words[i]}
    if ((want)); then
      want=0
    elif [[ $w == -* ]]; then
      [[ -n ${_stratad_values[$path|$w]+set} && $w != *=* ]] && want=1
    elif [[ " ${_stratad_subs[$path]} " == *" $w "* ]]; then
      path="$path $w"
    fi
  done
  if ((want)); then
    choices=${_stratad_values[$path|$prev]}
    if [[ $choices == :any ]]; then
      _files
    else
      compadd -- ${=choices}
    fi
  elif [[ $cur == -* ]]; then
    compadd -- ${=_stratad_opts[$path]}
  else
    choices="${_stratad_subs[$path]} ${_stratad_values[$path|]}"
    if [[ -n ${choices// /} ]]; then
      compadd -- ${=choices}
    else
      _files
    fi
  fi
}

compdef _stratad stratad
"""


def _zsh(nodes: list[Node]) -> str:
    header = [
        "#compdef stratad",
        "# zsh completion for stratad; generated by `stratad ctl completion zsh`.",
        "# Load it (after compinit): source <(stratad ctl completion zsh)",
    ]
    return "\n".join([*header, *_tables(nodes, "typeset -gA")]) + "\n" + _ZSH_FUNCTION


# --- fish ---------------------------------------------------------------------------------


def _fish(nodes: list[Node]) -> str:
    valued = [f"{n.path}|{option}" for n in nodes for option in n.valued]
    lines = [
        "# fish completion for stratad; generated by `stratad ctl completion fish`.",
        "# Load it: stratad ctl completion fish | source",
        "set -g __stratad_valued " + " ".join(_q(v) for v in valued),
        "",
        "function __stratad_subs",
        "    switch $argv[1]",
    ]
    for n in nodes:
        if n.subcommands:
            lines += [
                f"        case {_q(n.path)}",
                f"            printf '%s\\n' {' '.join(n.subcommands)}",
            ]
    lines += [
        "    end",
        "end",
        "",
        "# The command path typed so far, skipping options and their values.",
        "function __stratad_path",
        "    set -l tokens (commandline -opc)",
        "    set -l path stratad",
        "    set -l skip 0",
        "    for t in $tokens[2..-1]",
        "        if test $skip = 1",
        "            set skip 0",
        "        else if string match -q -- '-*' $t",
        '            contains -- "$path|$t" $__stratad_valued; and set skip 1',
        "        else if contains -- $t (__stratad_subs $path)",
        '            set path "$path $t"',
        "        end",
        "    end",
        "    echo $path",
        "end",
        "",
        "function __stratad_at",
        "    set -l path (__stratad_path)",
        '    test "$path" = "$argv[1]"',
        "end",
        "",
        "complete -c stratad -f",
    ]
    for n in nodes:
        at = _q(f"__stratad_at {_q(n.path)}")
        for sub in n.subcommands:
            lines.append(f"complete -c stratad -n {at} -a {_q(sub)} -d {_q(_brief(n.help[sub]))}")
        if n.positional_choices:
            lines.append(f"complete -c stratad -n {at} -a {_q(' '.join(n.positional_choices))}")
        for option in n.options:
            lines.append(_fish_option(at, option, n))
    return "\n".join(lines) + "\n"


def _fish_option(at: str, option: str, node: Node) -> str:
    flag = f"-l {_q(option[2:])}" if option.startswith("--") else f"-s {_q(option[1:])}"
    parts = [f"complete -c stratad -n {at} {flag}"]
    if option in node.valued:
        choices = node.valued[option]
        parts.append(f"-x -a {_q(' '.join(choices))}" if choices else "-r -F")
    parts.append(f"-d {_q(_brief(node.help.get(option, '')))}")
    return " ".join(parts)


def _brief(text: str) -> str:
    """The first clause of a help text: fish shows it beside the candidate."""
    return text.split(";")[0].split(" (")[0].replace("%%", "%")[:60]


__all__ = ["Node", "command_tree", "completion_script"]
