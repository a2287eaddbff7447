//! Agent-binary catalogues from simplestreams metadata, verified downloads, and a mirror generator.
