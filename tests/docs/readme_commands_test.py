#!/usr/bin/env python3
"""The README's shell blocks, run as written: each ```sh block of README.md,
taken from the README itself (never a copy), in document order, one fresh
`bash -e -o pipefail` a block, in a scratch copy of the source tree whose
`build` is the tree under test. The environment is a new user's: Debian's
PATH, and none of PYTHONPATH, GPUFEED_LIBRARY, GPUFEED_CLI, HDF5_PLUGIN_PATH,
LD_LIBRARY_PATH or VIRTUAL_ENV.

A block that cannot run here says so in the README with a comment line
inside it, `# ci: skip (REASON)` (a GPU, the whole suite): the reason is
required, each skip is printed, and the test fails unless at least
MIN_BLOCKS blocks ran, so it cannot silently run nothing.

  readme_commands_test.py SOURCE_DIR BUILD_DIR WORK_DIR MIN_BLOCKS
"""
import os
import re
import shutil
import subprocess
import sys
import time

FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"^\s*#\s*ci:\s*skip\b(.*)$")
REASON = re.compile(r"^\s*\((.+)\)\s*$")
BLOCK_TIMEOUT_S = 900


def shell_blocks(readme):
    """[(first line number, text)] of the README's ```sh / ```bash blocks."""
    blocks, lang, start, lines = [], None, 0, []
    with open(readme, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line.rstrip("\n"))
            if lang is None and m:
                lang, start, lines = m.group(1), n + 1, []
            elif lang is not None and line.strip() == "```":
                if lang in ("sh", "bash", "shell"):
                    blocks.append((start, "".join(lines)))
                lang = None
            elif lang is not None:
                lines.append(line)
    if lang is not None:
        sys.exit("README.md:%d: a code block is not closed" % start)
    return blocks


def skip_reason(text, line):
    """The block's `# ci: skip (REASON)`, None when it runs; a skip without a reason fails."""
    for k, l in enumerate(text.splitlines()):
        m = SKIP.match(l)
        if m:
            r = REASON.match(m.group(1))
            if not r:
                sys.exit("README.md:%d: '# ci: skip' needs a reason: '# ci: skip (why)'" % (line + k))
            return r.group(1)
    return None


def scratch_copy(source, build, work):
    """The source tree's files (tracked and untracked, not ignored) in `work`, `work/build` -> `build`."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    files = subprocess.run(["git", "-C", source, "ls-files", "-z", "-co", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    for rel in (f.decode() for f in files if f):
        src = os.path.join(source, rel)
        if not os.path.isfile(src):  # deleted in the working tree
            continue
        dst = os.path.join(work, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
    os.symlink(os.path.abspath(build), os.path.join(work, "build"))


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    source, build, work, min_blocks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    blocks = shell_blocks(os.path.join(source, "README.md"))
    scratch_copy(source, build, work)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GPUFEED_LIBRARY", "GPUFEED_CLI", "HDF5_PLUGIN_PATH", "LD_LIBRARY_PATH",
                        "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's, no pyenv shims
    ran = 0
    for line, text in blocks:
        reason = skip_reason(text, line)
        if reason is not None:
            print("README.md:%d: skipped (%s)" % (line, reason), flush=True)
            continue
        print("README.md:%d: running\n%s" % (line, text), flush=True)
        t0 = time.monotonic()
        try:
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=work, env=env,
                               timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            sys.exit("README.md:%d: the block ran past %d s" % (line, BLOCK_TIMEOUT_S))
        if r.returncode != 0:
            sys.exit("README.md:%d: the block failed (exit %d) after %.0f s" % (line, r.returncode,
                                                                               time.monotonic() - t0))
        print("README.md:%d: ok in %.0f s" % (line, time.monotonic() - t0), flush=True)
        ran += 1
    print("readme: %d of %d shell blocks ran, %d skipped with a reason" % (ran, len(blocks), len(blocks) - ran))
    if ran < min_blocks:
        sys.exit("readme: only %d blocks ran, fewer than %d: a '# ci: skip' too many?" % (ran, min_blocks))


if __name__ == "__main__":
    main()
