//! Embedded SQLite backend.
