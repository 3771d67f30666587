//! Reading one rule file: the parser's limits for files nobody vetted, and its errors with the
//! file, line and column of the node that is wrong.

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde_saphyr::{Localizer, Location, MessageFormatter, UserMessageFormatter};

use super::{Origin, RulesError};

/// Deepest nesting of mappings and sequences. The rules' own shapes nest 8 deep (a sample's
/// `event` a little more); a deeper file is no rule file, and the bound keeps the parser and
/// serde's buffering (a full `event`) from recursing without end.
const MAX_DEPTH: usize = 32;
/// Events that aliases may replay in one file. The default rules replay fewer than 100 (one
/// shared interpreter list); this stops an alias bomb ("billion laughs") long before memory
/// does, with an error.
const MAX_REPLAYED_EVENTS: usize = 100_000;

/// Parses `text` (the contents of `file`).
pub(super) fn parse<T: DeserializeOwned>(file: &str, text: &str) -> Result<T, RulesError> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! { max_depth: MAX_DEPTH },
        alias_limits: serde_saphyr::alias_limits! { max_total_replayed_events: MAX_REPLAYED_EVENTS },
        // YAML 1.2 booleans only (`yes` is a string), and `<<` is no merge: as the rules read
        // before (serde_yaml); a merge would also hide which node a value came from.
        strict_booleans: true,
        merge_keys: serde_saphyr::options::MergeKeyPolicy::Error,
        // One line per error, the place in front of it: no excerpt of the file.
        with_snippet: false,
    };
    serde_saphyr::from_str_with_options(text, options).map_err(|error| {
        let message = error.render_with_options(serde_saphyr::render_options! {
            formatter: &WithoutLocation,
            snippets: serde_saphyr::SnippetMode::Off,
        });
        RulesError::Invalid { origin: origin(file, error.location()), message }
    })
}

/// Where a node is, if the parser knows.
pub(super) fn origin(file: &str, at: Option<Location>) -> Origin {
    let at = at.filter(|at| *at != Location::UNKNOWN);
    Origin { file: file.to_owned(), line: at.map(|at| at.line() as usize), column: at.map(|at| at.column() as usize) }
}

/// The parser's message for a person (not its advice to the programmer), without the
/// location: [`Origin`] puts it in front.
struct WithoutLocation;

impl MessageFormatter for WithoutLocation {
    fn localizer(&self) -> &dyn Localizer {
        self
    }

    fn format_message<'a>(&self, error: &'a serde_saphyr::Error) -> Cow<'a, str> {
        UserMessageFormatter.format_message(error)
    }
}

impl Localizer for WithoutLocation {
    fn attach_location<'a>(&self, base: Cow<'a, str>, _: Location) -> Cow<'a, str> {
        base
    }
}
