#!/usr/bin/env python3
"""Write text as token shards in llm.c's format, for `ddplab train --head lm --data`.

Each byte of the text is one token (ids 0-255: a byte-level vocabulary, which every transformer preset covers), so
no tokenizer is needed and it runs offline. GPT-2's tokens come from llm.c's own dev/data scripts
(tinyshakespeare.py, fineweb.py), which write the same format.

    python3 scripts/text_to_tokens.py INPUT... --out train.bin [--val-out val.bin --val-share 0.1]

A shard is 256 little-endian int32 (magic 20240520, version 1, the token count) and then the tokens as uint16.
With --val-out, the last --val-share of the bytes go to a second shard instead. Each shard is written to a temporary
beside it and renamed into place: a failed run leaves no half-written shard.
"""
import argparse
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whole_file import write_whole  # noqa: E402 (beside this script)

MAGIC, VERSION = 20240520, 1


def write_shard(path, data):
    """data: bytes, one token each."""
    if len(data) >= 2**31:
        sys.exit(f"text_to_tokens: {path}: {len(data)} tokens, more than a shard's int32 count holds")
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
    args = p.parse_args()
    if args.val_out and not 0 < args.val_share < 1:
        sys.exit(f"text_to_tokens: --val-share must be between 0 and 1 (got {args.val_share})")
    data = bytearray()
    for name in args.inputs:
        try:
            with open(name, "rb") as f:
                data += f.read()
        except OSError as e:
            sys.exit(f"text_to_tokens: {name}: {e.strerror}")
    if len(data) < (2 if args.val_out else 1):
        sys.exit(f"text_to_tokens: the inputs hold {len(data)} bytes, too few for the shards asked for")
    if args.val_out:
        cut = len(data) - max(1, int(len(data) * args.val_share))
        write_shard(args.out, bytes(data[:cut]))
        write_shard(args.val_out, bytes(data[cut:]))
    else:
        write_shard(args.out, bytes(data))


if __name__ == "__main__":
    main()
