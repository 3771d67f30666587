//! The freedesktop notification server on the session bus: one connection for every `Notify`
//! call and for the `ActionInvoked` signals ("Details" opens the alert's incident page).
//! Without a session bus or a notification server, it says so once and tries again at the next
//! notification.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::StreamExt as _;
use zbus::{message::Type, Connection, MatchRule, MessageStream, Variant};

use super::{content::Notice, volume::Desk};

const NAME: &str = "org.freedesktop.Notifications";
const PATH: &str = "/org/freedesktop/Notifications";
/// A server that does not answer within this is taken as absent (the agent's alerts go on).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const DETAILS: &str = "details";

/// Which alert (`seq`) each notification's "Details" opens.
type Pages = Arc<Mutex<HashMap<u32, u64>>>;

pub struct Desktop {
    connection: Option<Connection>,
    pages: Pages,
    /// The agent's socket, and where incident pages are written.
    socket: PathBuf,
    cache: PathBuf,
    /// The last failure said, so that it is said once.
    said: Option<String>,
}

impl Desktop {
    pub fn new(socket: PathBuf, cache: PathBuf) -> Desktop {
        Desktop { connection: None, pages: Pages::default(), socket, cache, said: None }
    }

    /// The connection, made (with its signal reader) when there is none.
    fn connect(&mut self) -> zbus::Result<Connection> {
        if let Some(connection) = &self.connection {
            return Ok(connection.clone());
        }
        let connection = zbus::block_on(zbus::connection::Builder::session().method_timeout(CALL_TIMEOUT).build())?;
        let rule = MatchRule::builder().msg_type(Type::Signal).interface(NAME).path(PATH).build()?;
        // Subscribed before the first Notify, so that no action is missed.
        let stream = zbus::block_on(MessageStream::for_match_rule(rule, &connection, None))?;
        let (pages, socket, cache) = (Arc::clone(&self.pages), self.socket.clone(), self.cache.clone());
        std::thread::Builder::new()
            .name("notify-actions".into())
            .spawn(move || zbus::block_on(read_signals(stream, pages, socket, cache)))
            .map_err(|e| zbus::Error::InputOutput(Arc::new(e)))?;
        self.connection = Some(connection.clone());
        Ok(connection)
    }

    fn notify(&mut self, notice: &Notice, replaces: Option<u32>) -> zbus::Result<u32> {
        let connection = self.connect()?;
        let mut actions = Vec::new();
        if notice.details.is_some() {
            actions.extend(["default", "Details", DETAILS, "Details"]);
        }
        actions.extend(["dismiss", "Dismiss"]);
        let urgency: u8 = if notice.critical { 2 } else { 1 };
        let hints: HashMap<&str, Variant> = HashMap::from([
            ("urgency", Variant::from(urgency)),
            ("desktop-entry", Variant::from("credwatch-notify")),
            ("category", Variant::from("x-credwatch.alert")),
        ]);
        let icon = if notice.critical { "dialog-error" } else { "dialog-warning" };
        let reply = zbus::block_on(connection.call_method(
            Some(NAME),
            PATH,
            Some(NAME),
            "Notify",
            &("credwatch", replaces.unwrap_or(0), icon, &notice.summary, &notice.body, actions, hints, -1i32),
        ));
        let id: u32 = match reply {
            Ok(reply) => reply.body().deserialize()?,
            Err(error) => {
                // The bus may be gone (logout, restart): a new connection next time.
                if matches!(error, zbus::Error::InputOutput(_)) {
                    self.connection = None;
                }
                return Err(error);
            }
        };
        let mut pages = self.pages.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match notice.details {
            Some(seq) => pages.insert(id, seq),
            None => pages.remove(&id),
        };
        Ok(id)
    }
}

impl Desk for Desktop {
    fn show(&mut self, notice: &Notice, replaces: Option<u32>) -> Option<u32> {
        match self.notify(notice, replaces) {
            Ok(id) => {
                if self.said.take().is_some() {
                    tracing::info!("the notification server answers: alerts show as notifications again");
                }
                Some(id)
            }
            Err(error) => {
                let why = error.to_string();
                if self.said.is_none() {
                    tracing::warn!(
                        "no notification server on the session bus ({}): alerts are logged here; trying again at the next alert",
                        credwatch_core::output::escape(&why)
                    );
                }
                self.said = Some(why);
                None
            }
        }
    }
}

/// Reads the server's signals until the connection ends: "Details" (or a click) opens the
/// alert's incident page; a closed notification is forgotten.
async fn read_signals(mut stream: MessageStream, pages: Pages, socket: PathBuf, cache: PathBuf) {
    while let Some(Ok(message)) = stream.next().await {
        let header = message.header();
        let member = header.member().map(|m| m.as_str().to_owned()).unwrap_or_default();
        let body = message.body();
        match member.as_str() {
            "ActionInvoked" => {
                let Ok((id, action)) = body.deserialize::<(u32, String)>() else { continue };
                let seq = pages.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&id).copied();
                if let (Some(seq), DETAILS | "default") = (seq, action.as_str()) {
                    open_details(&socket, seq, &cache);
                }
            }
            "NotificationClosed" => {
                if let Ok((id, _reason)) = body.deserialize::<(u32, u32)>() {
                    pages.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&id);
                }
            }
            _ => {}
        }
    }
}

/// Writes the incident page of alert `seq` to the cache and opens it with `xdg-open`; says
/// `credwatch show SEQ` when it cannot.
fn open_details(socket: &Path, seq: u64, cache: &Path) {
    let page = cache.join(format!("incident-{seq}.html"));
    if let Err(error) = super::write_incident_page(socket, seq, &page) {
        tracing::warn!("writing the incident page of alert {seq}: {error:#}; see `credwatch show {seq}`");
        return;
    }
    let opened = Command::new("xdg-open").arg(&page).stdin(Stdio::null()).stdout(Stdio::null()).spawn();
    match opened {
        // Reaped in the background: xdg-open returns once the browser is started.
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(error) => tracing::warn!(
            "could not run xdg-open ({error}): the incident page of alert {seq} is {}; or see `credwatch show {seq}`",
            credwatch_core::output::escape(&page.display().to_string())
        ),
    }
}
