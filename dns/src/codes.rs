//! The response codes that metrics count one by one, the rest being `other`.

use hickory_proto::op::ResponseCode;

pub(crate) const RCODES: [&str; 7] = [
    "NOERROR", "NXDOMAIN", "SERVFAIL", "REFUSED", "NOTIMP", "FORMERR", "other",
];

/// Indexes into [`RCODES`]; a match, not a search, because every response counts.
pub(crate) fn rcode_index(rcode: ResponseCode) -> usize {
    match rcode {
        ResponseCode::NoError => 0,
        ResponseCode::NXDomain => 1,
        ResponseCode::ServFail => 2,
        ResponseCode::Refused => 3,
        ResponseCode::NotImp => 4,
        ResponseCode::FormErr => 5,
        _ => RCODES.len() - 1,
    }
}
