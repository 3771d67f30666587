//! credwatch: watches package-manager process trees and alerts when package code touches
//! credentials. One [`event::Event`] stream, from the live sensor or a trace, feeds one
//! [`engine::Engine`], which produces [`alert::Alert`]s.

pub mod alert;
pub mod engine;
pub mod event;
pub mod import;
pub mod input;
pub mod names;
pub mod net;
pub mod output;
pub mod report;
pub mod rules;
pub mod sensor;
pub mod trace;
