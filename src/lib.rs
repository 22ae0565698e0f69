#![deny(clippy::all)]
