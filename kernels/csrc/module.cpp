// Python module stub: `import torchrec_ascend.kernels._C` loads this shared library, which runs the static
// TORCH_LIBRARY / TORCH_LIBRARY_IMPL initialisers and so registers torch.ops.torchrec_ascend.*.
#include <Python.h>

extern "C" {
PyObject* PyInit__C(void) {
  // name, no docstring, no per-module state, no methods, slots, GC hooks or free function
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module_def);
}
}
