"""The exec tool's deny list: destructive commands, looked for in every segment of a command line.

A safety net, not a sandbox (the boundary is the SHELL permission and the unprivileged user). It
errs on the side of refusing: segments are cut at every `;`, `&&`, `||`, `|`, `&`, newline,
`$(`, backtick, parenthesis and brace, even inside quotes, and the strings of `sh -c` (`sh -ec`,
`bash -lc`, `bash -o pipefail -c --`...) and `eval` are checked recursively.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import PurePosixPath

SEPARATORS = re.compile(r"&&|\|\||[;|&\n\r`(){}]|\$\(")
# `f() {`, `function f {`, `function f() {`: a name holds no quote, so `sh -c ':(){...'` names `:`
NAME = r"(?<![^\s(){};|&<>'\"`])[^\s(){};|&<>'\"`]+"  # (the lookbehind: each run of name characters is tried
# from its start alone; from every position of it, a 20,000-character word took seconds)
DEFINITION = re.compile(rf"(?:\bfunction\s+({NAME})\s*(?:\(\s*\))?|({NAME})\s*\(\s*\))\s*\{{")
CALL_START = r"(?:^|[;&|({\n]|\b(?:do|then|else)\s)\s*"  # where a body's word is a command
CALL_END = r"(?=[\s;&|)}]|$)"
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
WRAPPERS = {"sudo", "doas", "env", "nice", "nohup", "time", "command", "builtin", "exec", "busybox",
            "ionice", "stdbuf", "setsid", "chroot", "timeout", "xargs", "unbuffer"}
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "hush", "fish"}
VALUED_LONG_OPTIONS = {"--rcfile", "--init-file"}  # bash's: the next word is theirs, not the command
COMMAND_LONG_OPTIONS = {"--command", "--init-command"}  # fish's -c and -C
ROOTS = re.compile(r"^(/+\.?|/+\*|~/?\*?|\$\{?HOME\}?/?\*?|/+[^/\s]+/*\*?)$")
DEVICE = re.compile(r"^/dev/(sd|hd|vd|xvd|nvme|mmcblk|disk|md|dm-|mapper/|loop|root)")
POWER = {"shutdown", "reboot", "poweroff", "halt"}
MKFS = re.compile(r"^(mkfs(\..+)?|mke2fs|mkswap|wipefs|fdisk|sfdisk|parted|diskpart|format)$")
JUDGED = {"rm", "chmod", "chown", "chgrp", "find", "dd", "shred", "init", "systemctl", "eval", *POWER, *SHELLS}


class Denied(ValueError):
    """A command the deny list refuses; the message says which part and why."""


def _tokens(segment: str) -> list[str]:
    try:
        return shlex.split(segment, posix=True)
    except ValueError:  # unbalanced quotes: judge the words as they are
        return [w.strip("'\"") for w in segment.split()]


def _name(word: str) -> str:
    return PurePosixPath(word).name


def _command_words(words: list[str]) -> list[str]:
    """The words from the real command on: past `VAR=x` assignments and wrappers such as sudo."""
    i = 0
    while i < len(words) and ASSIGNMENT.match(words[i]):
        i += 1
    words = words[i:]
    if not words or _name(words[0]) not in WRAPPERS:
        return words
    # `sudo -u root rm ...`, `timeout 5 reboot`, `xargs rm -rf`: skip to the first command we judge
    for j, word in enumerate(words[1:], start=1):
        if _name(word) in JUDGED or MKFS.match(_name(word)):
            return words[j:]
    return []


def _recursive(flags: list[str]) -> bool:
    return any(f in ("--recursive", "-R") or (f.startswith("-") and not f.startswith("--") and "r" in f.lower())
               for f in flags)


def _is_root(path: str) -> bool:
    return bool(ROOTS.match(path) or ROOTS.match(posixpath.normpath(path)))


def _check_rm(args: list[str]) -> str | None:
    flags = [a for a in args if a.startswith("-")]
    targets = [a for a in args if not a.startswith("-")]
    if "--no-preserve-root" in flags:
        return "rm --no-preserve-root"
    if _recursive(flags) and any(_is_root(t) for t in targets):
        return "recursive rm of a root or home folder"
    return None


def _check_words(words: list[str]) -> str | None:
    if not words:
        return None
    cmd, args = _name(words[0]), words[1:]
    if cmd == "rm":
        return _check_rm(args)
    if cmd in ("chmod", "chown", "chgrp") and _recursive(args) and any(_is_root(a) for a in args):
        return f"recursive {cmd} of a root folder"
    if cmd == "find" and args and _is_root(args[0]) and ("-delete" in args or "rm" in args):
        return "find deleting from a root folder"
    if MKFS.match(cmd):
        return f"{cmd} (formats or partitions disks)"
    if cmd == "dd" and any(a.startswith("of=") and DEVICE.match(a[3:]) for a in args):
        return "dd writing to a device"
    if cmd == "shred" and any(DEVICE.match(a) for a in args):
        return "shred of a device"
    if cmd in POWER or (cmd == "init" and args[:1] in (["0"], ["6"])):
        return f"{cmd} (stops the machine)"
    if cmd == "systemctl" and any(a in POWER | {"kexec", "suspend", "hibernate"} for a in args):
        return "systemctl power action"
    return None


def _redirects_to_device(segment: str) -> bool:
    return any(DEVICE.match(m) for m in re.findall(r">\s*(/dev/\S+)", segment))


def _command_string(args: list[str]) -> str | None:
    """The string a shell given `args` runs: its first operand, when a short-option word holds a `c`.

    `-c`, `-ec`, `-lc` and `-xec` all take it, and not as the word after the option but as the
    first word that is no option: `bash -c -- "..."`, `bash -c -o pipefail "..."`. `-o`/`-O`
    (one per letter, as `-eo`) and `--rcfile` take the next word as theirs.
    """
    has_c, rest = False, iter(args)
    for word in rest:
        if word in ("-", "--"):
            return next(rest, None) if has_c else None
        if word.startswith("--"):  # `--login`, `--norc`; fish's `--command` takes the string
            option, given, value = word.partition("=")
            if option in COMMAND_LONG_OPTIONS:
                if given:
                    return value
                has_c = True
            elif word in VALUED_LONG_OPTIONS:
                next(rest, None)
        elif word[:1] in ("-", "+") and len(word) > 1:
            has_c = has_c or (word[0] == "-" and ("c" in word or "C" in word))  # (fish: -C, an init command)
            for _ in range(word.count("o") + word.count("O")):
                next(rest, None)
        else:
            return word if has_c else None
    return None


def check_segment(segment: str, depth: int = 0) -> None:
    """Raise Denied if this one simple command is destructive (recursing into `sh -c` and `eval`)."""
    if _redirects_to_device(segment):
        raise Denied(f"refused: writing to a disk device in '{segment.strip()}'")
    words = _command_words(_tokens(segment))
    reason = _check_words(words)
    if reason:
        raise Denied(f"refused: {reason} in '{segment.strip()}'")
    if depth < 3 and words:
        name = _name(words[0])
        if name in SHELLS:
            nested = _command_string(words[1:])
            if nested is not None:
                check_command(nested, depth + 1)
        elif name == "eval":
            check_command(" ".join(words[1:]), depth + 1)


def _body(command: str, start: int) -> str:
    """The function body that starts at `start`, just past its `{`: up to the brace that closes it
    (so `${x}` inside does not end it), or to the end of the command."""
    depth = 1
    for i in range(start, len(command)):
        if command[i] == "{":
            depth += 1
        elif command[i] == "}":
            depth -= 1
            if depth == 0:
                return command[start:i]
    return command[start:]


def is_fork_bomb(command: str) -> bool:
    """Whether `command` defines a function that starts itself in the background or piped into itself
    (`:(){ :|:& };:`, `f(){ f & f; }`): each call starts another that does the same, without end.

    A function that calls itself in the foreground, or with arguments (`walk "$d" &`), passes:
    recursion is ordinary, and whether it ends is not for a deny list to judge.
    """
    for match in DEFINITION.finditer(command):
        name = re.escape(match.group(1) or match.group(2))
        itself = CALL_START + name + CALL_END
        background = itself + r"\s*(?:&(?!&)|\|(?!\|)\s*" + name + CALL_END + ")"  # `f &`, `f | f`
        if re.search(background, _body(command, match.end())):
            return True
    return False


def segments(command: str) -> list[str]:
    """The simple commands of a command line, cut at every operator and substitution."""
    return [s for s in SEPARATORS.split(command) if s.strip()]


def check_command(command: str, depth: int = 0) -> None:
    """Raise Denied if any segment of `command` matches the deny list."""
    if is_fork_bomb(command):
        raise Denied("refused: fork bomb")
    for segment in segments(command):
        check_segment(segment, depth)
