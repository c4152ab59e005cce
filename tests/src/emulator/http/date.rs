//! The `Date` header, as Go's net/http puts on every kube-apiserver answer (RFC 9110
//! IMF-fixdate), from the emulator's clock: an emulator whose clock is offset
//! ([`crate::emulator::ClockMode::Offset`]) is an API server whose clock is skewed.

use hyper::header::{DATE, HeaderValue};
use time::OffsetDateTime;
use time::format_description::StaticFormatDescription;
use time::macros::format_description;

use super::RespBody;

const IMF_FIXDATE: StaticFormatDescription = format_description!(
    "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
);

/// Sets `Date` to `now` (hyper would otherwise stamp the system time).
pub(super) fn stamp(response: &mut hyper::Response<RespBody>, now: OffsetDateTime) {
    let text = now
        .to_offset(time::UtcOffset::UTC)
        .format(IMF_FIXDATE)
        .ok()
        .and_then(|t| HeaderValue::from_str(&t).ok());
    if let Some(value) = text {
        response.headers_mut().insert(DATE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use time::macros::datetime;

    #[test]
    fn the_date_is_an_imf_fixdate_in_gmt() {
        let mut r = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::new()).boxed());
        stamp(&mut r, datetime!(2026-12-01 16:25:48 +1));
        assert_eq!(r.headers()[DATE], "Tue, 01 Dec 2026 15:25:48 GMT");
    }
}
