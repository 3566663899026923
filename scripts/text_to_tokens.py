#!/usr/bin/env python3
"""Write text as token shards in llm.c's format, for `ddplab train --head lm --data`.

Each byte of the text is one token (ids 0-255: a byte-level vocabulary, which every transformer preset covers), so
no tokenizer is needed and it runs offline. GPT-2's tokens come from llm.c's own dev/data scripts
(tinyshakespeare.py, fineweb.py), which write the same format.

    python3 scripts/text_to_tokens.py INPUT... --out train.bin [--val-out val.bin --val-share 0.1] [--force]

A shard is 256 little-endian int32 (magic 20240520, version 1, the token count) and then the tokens as uint16.
With --val-out, the last --val-share of the bytes go to a second shard instead. Each shard is written to a temporary
beside it and renamed into place: a failed run leaves no half-written shard. An existing file is replaced only with
--force, and never one of the inputs. Bad input: one line, exit code 2, before anything is written.
"""
import argparse
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whole_file import write_whole  # noqa: E402 (beside this script)

MAGIC, VERSION = 20240520, 1


def refuse(message):
    print(f"text_to_tokens: {message}", file=sys.stderr)
    sys.exit(2)


def same_file(a, b):
    """Two paths that name one file, whether or not it exists yet."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.abspath(a) == os.path.abspath(b)


def check_outputs(outputs, inputs, force):
    """Each output can be written: not twice, not an input, not an existing file without --force, in a folder."""
    for i, path in enumerate(outputs):
        if any(same_file(path, earlier) for earlier in outputs[:i]):
            refuse(f"--out and --val-out name the same file ({path}): the validation shard would replace the other")
        for name in inputs:
            if same_file(path, name):
                refuse(f"output {path} is {name}, which this command reads: name another")
        if os.path.isdir(path):
            refuse(f"output {path} is a folder (name a file)")
        if os.path.lexists(path) and not force:
            refuse(f"output file {path} already exists (pass --force to overwrite)")
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            refuse(f"output folder {folder} does not exist")


def write_shard(path, data):
    """data: bytes, one token each."""
    header = struct.pack("<256i", MAGIC, VERSION, len(data), *([0] * 253))
    tokens = bytearray(2 * len(data))  # little-endian uint16: the byte, then 0 (twice the text's memory, no more)
    tokens[0::2] = data
    write_whole(path, header, bytes(tokens))
    print(f"{path}: {len(data)} tokens")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", help="text files, concatenated in this order")
    p.add_argument("--out", required=True, help="the training shard")
    p.add_argument("--val-out", help="a validation shard of the last --val-share of the bytes")
    p.add_argument("--val-share", type=float, default=0.1, help="with --val-out (default 0.1)")
    p.add_argument("--force", action="store_true", help="replace existing shards")
    args = p.parse_args()
    if args.val_out and not 0 < args.val_share < 1:
        refuse(f"--val-share must be between 0 and 1 (got {args.val_share})")
    check_outputs([args.out] + ([args.val_out] if args.val_out else []), args.inputs, args.force)
    data = bytearray()
    for name in args.inputs:
        try:
            with open(name, "rb") as f:
                data += f.read()
        except OSError as e:
            refuse(f"{name}: {e.strerror}")
    if len(data) < (2 if args.val_out else 1):
        refuse(f"the inputs hold {len(data)} bytes, too few for the shards asked for")
    shards = [(args.out, bytes(data))]
    if args.val_out:
        cut = len(data) - max(1, int(len(data) * args.val_share))
        shards = [(args.out, bytes(data[:cut])), (args.val_out, bytes(data[cut:]))]
    for path, tokens in shards:
        if len(tokens) >= 2**31:
            refuse(f"{path}: {len(tokens)} tokens, more than a shard's int32 count holds")
    for path, tokens in shards:
        try:
            write_shard(path, tokens)
        except OSError as e:  # a full disk, say: the shard is not there, and what failed is said in one line
            print(f"text_to_tokens: cannot write {path}: {e.strerror}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
