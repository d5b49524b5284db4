//! The subcommands other than `nodus run`: each a short program over the agent's pieces.

pub mod cleanup;
pub mod proxy;
pub mod status;
pub mod view;
