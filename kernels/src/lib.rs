//! Numeric kernels. Filled in by the model-core work.
