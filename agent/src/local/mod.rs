//! The agent's local alert log and its socket (issue 26; the contract is
//! /work/notes/local-protocol.md, summed up in the README's "Past alerts"): `watch` appends every
//! alert to the log with a sequence number and serves it, and the live alerts, on a Unix socket
//! to the users of this machine, each seeing only their own unless root or of group `credwatch`.
//! `credwatch alerts`, `show`, `notify` and `selftest` are its clients.

pub mod client;
pub mod log;
pub mod protocol;
