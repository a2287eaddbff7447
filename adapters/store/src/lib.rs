//! Persistent state for controllers: the store trait, an in-memory model and embedded SQLite.
