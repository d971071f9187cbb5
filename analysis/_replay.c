/* FIFO k-server queue replay for analysis.capacity (optional; the Python loop gives the same numbers).
 *
 * fifo_replay(a, s, n, k, lat, heap): requests in arrival order (a ascending), service times s,
 * k identical servers; lat[j] = finish - arrival. heap: caller's scratch of min(k, n) int64.
 * Each request begins at max(its arrival, the earliest server free time): a binary min-heap of
 * the servers' free times, O(n log k). Returns 0, or -1 on bad arguments.
 *
 * Built by setup.py as the extension module analysis._replay: the module itself is empty (so
 * that importing it, as tools that walk the package do, works) and the function is reached
 * through ctypes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static void sift_down(int64_t *h, int64_t m, int64_t i) {
    int64_t v = h[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

int fifo_replay(const int64_t *a, const int64_t *s, int64_t n, int64_t k, int64_t *lat, int64_t *heap) {
    if (k < 1 || n < 0) return -1;
    if (n == 0) return 0;
    int64_t m = k < n ? k : n;
    for (int64_t i = 0; i < m; i++) heap[i] = a[0];
    for (int64_t j = 0; j < n; j++) {
        int64_t t = heap[0];
        int64_t begin = a[j] > t ? a[j] : t;
        int64_t fin = begin + s[j];
        heap[0] = fin;
        sift_down(heap, m, 0);
        lat[j] = fin - a[j];
    }
    return 0;
}

static struct PyModuleDef replay_module = {
    PyModuleDef_HEAD_INIT, "_replay", "FIFO k-server replay kernel; called through ctypes (analysis.capacity).",
    -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&replay_module); }
