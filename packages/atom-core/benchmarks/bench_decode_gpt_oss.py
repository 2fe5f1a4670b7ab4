"""GPT-OSS decode with MXFP4 experts (issue 54): bench_decode's method and table for gpt-oss-20b and
gpt-oss-120b, whose rooflines count the experts' MXFP4 bytes.

  python -m benchmarks run decode_gpt_oss [-- --models gpt-oss-20b]
"""

from __future__ import annotations

from benchmarks.bench_decode import GPT_OSS
from benchmarks.bench_decode import main as decode_main


def main() -> dict:
    return decode_main(GPT_OSS)


if __name__ == "__main__":
    main()
