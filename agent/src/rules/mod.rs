//! Rules are data: YAML files with `schema: 1`, embedded defaults plus `--rules DIR`.

pub mod manager;
