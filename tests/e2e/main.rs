//! End-to-end tests: the real `nodus` binary against the API-server stand-in over HTTP.

mod agent;
mod dns;
mod mesh;
mod proxy;
mod sandbox;
mod support;
mod view;
