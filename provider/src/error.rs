//! The provider's error type: one variant per kind of failure a verb can report, mapped to the
//! errno libibverbs would return.

use std::fmt;
use std::io;

use ferroce_transport::{ModifyQpError, PostError, VerbError};

/// Why a verb failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system call failed (socket, mapping, thread).
    Io(io::Error),
    /// The address and port are taken by another process or device (EADDRINUSE).
    AddressInUse(std::net::SocketAddr),
    /// A host-wide name (a GSI service ID or class) is held by another process (EADDRINUSE).
    Taken(String),
    /// No such device / address on this host (ENODEV).
    NoDevice(String),
    /// A wildcard bind overlaps a port another ID holds (EADDRNOTAVAIL, the kernel rdma_cm's
    /// answer when either binding is a wildcard).
    AddressNotAvailable(String),
    /// `modify_qp` refused the transition or an attribute (EINVAL).
    Modify(ModifyQpError),
    /// A post refused the work request (EINVAL, or ENOMEM for a full queue).
    Post(PostError),
    /// The object still has children or unacknowledged events (EBUSY).
    Busy(&'static str),
    /// An argument is out of range (EINVAL).
    InvalidArgument(&'static str),
    /// An argument is out of range, with the values said (EINVAL): "initiator_depth 200
    /// exceeds the device's max_qp_init_rd_atom (128)".
    Invalid(String),
    /// The connection manager refused the call in the connection's state (EINVAL).
    Cm(ferroce_transport::cm::CmError),
    /// The object belongs to another context or protection domain (EINVAL).
    WrongParent(&'static str),
    /// Not supported by ferroce (EOPNOTSUPP).
    NotSupported(&'static str),
    /// `post_send_batch` stopped at the work request `index` (the ones before it were
    /// posted), for `error` (verbs' `bad_wr`).
    Refused {
        /// The position of the refused work request in the batch.
        index: usize,
        /// Why it was refused.
        error: Box<Error>,
    },
}

/// `Result` with the provider's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "{e}"),
            Error::AddressInUse(a) => write!(
                f,
                "{a} is already in use by another user's ferroce processes or by a program that is not \
                 ferroce (processes of one user share an address; others need their own: \
                 another 127.x.y.z, or FERROCE_DEVICES)"
            ),
            Error::Taken(what) => f.write_str(what),
            Error::NoDevice(d) => write!(f, "no device {d}"),
            Error::AddressNotAvailable(what) => f.write_str(what),
            Error::Modify(e) => write!(f, "modify_qp: {e}"),
            Error::Post(e) => write!(f, "post: {e}"),
            Error::Busy(what) => write!(f, "resource busy: {what}"),
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::Invalid(what) => write!(f, "invalid argument: {what}"),
            Error::Cm(e) => write!(f, "connection manager: {e}"),
            Error::WrongParent(what) => write!(f, "object from another parent: {what}"),
            Error::NotSupported(what) => write!(f, "not supported: {what}"),
            Error::Refused { index, error } => write!(f, "work request {index}: {error}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            Error::Modify(e) => Some(e),
            Error::Post(e) => Some(e),
            Error::Refused { error, .. } => Some(error.as_ref()),
            _ => None,
        }
    }
}

impl Error {
    /// The errno libibverbs reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::AddressInUse(_) | Error::Taken(_) => libc::EADDRINUSE,
            Error::NoDevice(_) => libc::ENODEV,
            Error::AddressNotAvailable(_) => libc::EADDRNOTAVAIL,
            Error::Post(PostError::QueueFull) => libc::ENOMEM,
            Error::Modify(_)
            | Error::Post(_)
            | Error::InvalidArgument(_)
            | Error::Invalid(_)
            | Error::Cm(_)
            | Error::WrongParent(_) => libc::EINVAL,
            Error::Busy(_) => libc::EBUSY,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::Refused { error, .. } => error.errno(),
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io(e) => e,
            other => io::Error::from_raw_os_error(other.errno()),
        }
    }
}

impl From<VerbError> for Error {
    fn from(e: VerbError) -> Error {
        match e {
            VerbError::Modify(m) => Error::Modify(m),
            VerbError::Post(p) => Error::Post(p),
            VerbError::Busy => Error::Busy("an SRQ with QPs attached"),
            VerbError::NoSuchQp(_) => Error::InvalidArgument("no such QP"),
            VerbError::NoSuchSrq(_) => Error::InvalidArgument("no such SRQ"),
            VerbError::QpExists(_) => Error::Busy("QP1 exists"),
            // ENOMEM, as the kernel's limit on attachments.
            VerbError::Mcast(ferroce_transport::McastError::Full) => {
                Error::Io(io::Error::from_raw_os_error(libc::ENOMEM))
            }
            VerbError::Mcast(m) => Error::Invalid(m.to_string()),
            _ => Error::InvalidArgument("verb refused"),
        }
    }
}
