"""Print which of a fixed list of shape identities and inequalities the analyzer proves.

    python scripts/symbolic_identities.py

Each line is PROVED or NOT PROVED (not proved means the analyzer could not show it, not that
it is false); the last line is the count.  Every entry is true for the ranges it states.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from relaxweb.ir.symbolic import Analyzer, PrimExpr, SizeVar, expr_max, expr_min  # noqa: E402

n, m, k = SizeVar("n"), SizeVar("m"), SizeVar("k")
DEFAULT = Analyzer()

# (text, relation, a, b, analyzer): relation is "==", "<=", "<", ">=" or ">".
IDENTITIES: list[tuple[str, str, PrimExpr | int, PrimExpr | int, Analyzer]] = [
    ("(n*4)//4 == n", "==", (n * 4) // 4, n, DEFAULT),
    ("(n+3)//4*4 >= n", ">=", (n + 3) // 4 * 4, n, DEFAULT),
    ("n*m*2 == 2*m*n", "==", n * m * 2, 2 * m * n, DEFAULT),
    ("min(n, n+1) == n", "==", expr_min(n, n + 1), n, DEFAULT),
    ("(n*12*64)//(12*64) == n", "==", (n * 12 * 64) // (12 * 64), n, DEFAULT),
    ("(n+7)//8*8 >= n", ">=", (n + 7) // 8 * 8, n, DEFAULT),
    ("(n+7)//8*8 < n + 8", "<", (n + 7) // 8 * 8, n + 8, DEFAULT),
    ("n*m // m == n", "==", n * m // m, n, DEFAULT),
    ("(n*4+3) % 4 == 3", "==", (n * 4 + 3) % 4, 3, DEFAULT),
    ("n//4*4 + n%4 == n", "==", n // 4 * 4 + n % 4, n, DEFAULT),
    ("min(n, 64) <= 64", "<=", expr_min(n, 64), 64, DEFAULT),
    ("max(n, 1) >= 1", ">=", expr_max(n, 1), 1, DEFAULT),
    ("(n*768)//768//12 == n//12", "==", (n * 768) // 768 // 12, n // 12, DEFAULT),
    ("n - n//2 >= n//2", ">=", n - n // 2, n // 2, DEFAULT),
    ("(n*m*4)//(m*2) == n*2", "==", (n * m * 4) // (m * 2), n * 2, DEFAULT),
    ("(n*m + m)//m == n + 1", "==", (n * m + m) // m, n + 1, DEFAULT),
    ("(n//4)//2 == n//8", "==", (n // 4) // 2, n // 8, DEFAULT),
    ("(n*4)//8 == n//2", "==", (n * 4) // 8, n // 2, DEFAULT),
    ("(n%8)%4 == n%4", "==", (n % 8) % 4, n % 4, DEFAULT),
    ("n%4 < 4", "<", n % 4, 4, DEFAULT),
    ("n%4 <= n", "<=", n % 4, n, DEFAULT),
    ("n//4 <= n", "<=", n // 4, n, DEFAULT),
    ("(n+63)//64*64 - n < 64", "<", (n + 63) // 64 * 64 - n, 64, DEFAULT),
    ("max(n, m) >= min(n, m)", ">=", expr_max(n, m), expr_min(n, m), DEFAULT),
    ("min(n, m) + max(n, m) >= n", ">=", expr_min(n, m) + expr_max(n, m), n, DEFAULT),
    ("(n*m + n) // (m + 1) == n", "==", (n * m + n) // (m + 1), n, DEFAULT),
    ("(n//4 + 1)//2 == (n + 4)//8", "==", (n // 4 + 1) // 2, (n + 4) // 8, DEFAULT),
    ("n*k*m // (k*m) == n", "==", n * k * m // (k * m), n, DEFAULT),
    ("n*m % m == 0", "==", n * m % m, 0, DEFAULT),
    ("n//2*2 <= n", "<=", n // 2 * 2, n, DEFAULT),
    ("n//4 + m//4 <= (n+m)//4", "<=", n // 4 + m // 4, (n + m) // 4, DEFAULT),
    ("(n+m)//4 <= n//4 + m//4 + 1", "<=", (n + m) // 4, n // 4 + m // 4 + 1, DEFAULT),
    ("max(n - 8, 0) + 8 >= n", ">=", expr_max(n - 8, 0) + 8, n, DEFAULT),
    ("(n%4)*2 < 8", "<", (n % 4) * 2, 8, DEFAULT),
    ("n*n >= n", ">=", n * n, n, DEFAULT),
    ("min(n, m)*2 <= n + m", "<=", expr_min(n, m) * 2, n + m, DEFAULT),
    ("(n*m)//4 >= (n//4)*m", ">=", (n * m) // 4, (n // 4) * m, DEFAULT),
    ("n // 64 == 0 given n <= 63", "==", n // 64, 0, Analyzer({"n": (0, 63)})),
    ("n % 8 == n given n <= 7", "==", n % 8, n, Analyzer({"n": (0, 7)})),
    ("min(n, 64) == n given n <= 64", "==", expr_min(n, 64), n, Analyzer({"n": (0, 64)})),
    ("n*m <= 4096 given n, m <= 64", "<=", n * m, 4096, Analyzer({"n": (0, 64), "m": (0, 64)})),
    ("n // m <= n given m >= 1", "<=", n // m, n, Analyzer({"m": (1, None)})),
    ("n % m < m given m >= 1", "<", n % m, m, Analyzer({"m": (1, None)})),
    ("(n+127)//128 <= 8 given n <= 1024", "<=", (n + 127) // 128, 8, Analyzer({"n": (0, 1024)})),
    ("n - m >= 1 given n >= 8, m <= 7", ">=", n - m, 1, Analyzer({"n": (8, None), "m": (0, 7)})),
]


def check(relation: str, a: PrimExpr | int, b: PrimExpr | int, analyzer: Analyzer) -> bool:
    provers: dict[str, Callable[[], bool]] = {
        "==": lambda: analyzer.prove_equal(a, b),
        "<=": lambda: analyzer.prove_less_equal(a, b),
        "<": lambda: analyzer.prove_less(a, b),
        ">=": lambda: analyzer.prove_less_equal(b, a),
        ">": lambda: analyzer.prove_less(b, a),
    }
    return provers[relation]()


def main() -> int:
    proved = 0
    width = max(len(text) for text, *_ in IDENTITIES)
    for text, relation, a, b, analyzer in IDENTITIES:
        ok = check(relation, a, b, analyzer)
        proved += ok
        print(f"{text:<{width}}  {'PROVED' if ok else 'NOT PROVED'}")
    print(f"proved {proved} of {len(IDENTITIES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
