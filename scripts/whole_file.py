"""Writing a file whole or not at all, for the scripts that write results beside a user's files."""
import os


def write_whole(path, *parts):
    """Writes the parts (all str or all bytes) to path whole or not at all: into a temporary beside it, synced, then
    renamed into place; on any failure (a full disk) the temporary is removed and the error raised."""
    tmp = f"{path}.tmp.{os.getpid()}"
    binary = bool(parts) and isinstance(parts[0], (bytes, bytearray))
    try:
        with open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
