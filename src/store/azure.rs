//! Azure Storage backend (the only module that touches the azure_* crates).
