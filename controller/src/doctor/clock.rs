//! `clock-skew`: the API server's clock, from the `Date` header of its answer to `/version`,
//! against the local one. kube-apiserver accepts a PodCertificateRequest's `status.notBefore`
//! only within 5 minutes of its own clock (exclusive); podca dates certificates 60 s back, so
//! an API server 4 minutes ahead, or 6 minutes behind, refuses every certificate podca issues.

use kube::Client;
use podca_authority::Clock;
use time::format_description::StaticFormatDescription;
use time::macros::format_description;
use time::{Duration, OffsetDateTime, PrimitiveDateTime};

use super::{Check, ProbeError, Status};

/// The `Date` header's format (RFC 9110 IMF-fixdate), e.g. `Tue, 01 Dec 2026 15:25:48 GMT`.
const IMF_FIXDATE: StaticFormatDescription = format_description!(
    "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
);

/// podca's notBefore backdating (README, "Validity").
const BACKDATE: Duration = Duration::seconds(60);
/// kube-apiserver's window for notBefore, either side of its clock.
const WINDOW: Duration = Duration::minutes(5);
/// More skew than this warns: the clocks are not synchronised.
const WARN_SKEW: Duration = Duration::seconds(30);

/// The API server's clock minus the local one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Skew {
    pub skew: Duration,
}

pub(super) async fn measure(client: &Client, clock: &Clock) -> Result<Skew, ProbeError> {
    let request = http::Request::get("/version")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let before = clock.as_ref()();
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .map_err(|e| format!("GET /version: {e}"))?;
    let after = clock.as_ref()();
    let date = response
        .headers()
        .get(http::header::DATE)
        .ok_or("the API server's answer has no Date header")?
        .to_str()
        .map_err(|e| format!("Date header: {e}"))?;
    let server = parse_date(date)?;
    // The header has whole seconds: the server's time was in [date, date + 1 s).
    let local = before + (after - before) / 2;
    Ok(Skew {
        skew: server + Duration::milliseconds(500) - local,
    })
}

fn parse_date(text: &str) -> Result<OffsetDateTime, ProbeError> {
    PrimitiveDateTime::parse(text, IMF_FIXDATE)
        .map(PrimitiveDateTime::assume_utc)
        .map_err(|e| ProbeError(format!("Date header {text:?}: {e}")))
}

pub(super) fn check(skew: &Result<Skew, ProbeError>) -> Check {
    const NAME: &str = "clock-skew";
    let skew = match skew {
        Ok(s) => s.skew,
        Err(e) => return Check::new(NAME, Status::Fail, e.to_string()),
    };
    let (status, detail) = verdict(skew);
    Check::new(NAME, status, detail)
}

fn verdict(skew: Duration) -> (Status, String) {
    let seconds = skew.whole_seconds();
    let how = match seconds {
        0 => "in step with the local clock".to_owned(),
        s if s > 0 => format!("{s}s ahead of the local clock"),
        s => format!("{}s behind the local clock", -s),
    };
    let summary = format!("the API server's clock is {how}");
    // podca's notBefore, in the API server's time, is now - BACKDATE - skew.
    let not_before_offset = -BACKDATE - skew;
    if not_before_offset <= -WINDOW || not_before_offset >= WINDOW {
        (
            Status::Fail,
            format!(
                "{summary}: kube-apiserver refuses a notBefore more than 5 minutes off its clock, \
                 so it refuses every certificate podca signs here; synchronise the clocks (NTP)"
            ),
        )
    } else if skew.abs() > WARN_SKEW {
        (
            Status::Warn,
            format!("{summary}: more than 30s; synchronise the clocks (NTP)"),
        )
    } else {
        (Status::Ok, summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn the_date_header_parses() {
        assert_eq!(
            parse_date("Tue, 01 Dec 2026 15:25:48 GMT"),
            Ok(datetime!(2026-12-01 15:25:48 UTC))
        );
        assert!(
            parse_date("yesterday")
                .unwrap_err()
                .to_string()
                .starts_with("Date header \"yesterday\": "),
        );
    }

    #[test]
    fn the_skew_fails_where_kube_apiserver_would_refuse_podca_s_not_before() {
        let s = Duration::seconds;
        let cases = [
            (s(0), Status::Ok),
            (s(-30), Status::Ok),
            (s(31), Status::Warn),
            (s(239), Status::Warn),
            (s(240), Status::Fail),
            (s(-359), Status::Warn),
            (s(-360), Status::Fail),
        ];
        for (skew, status) in cases {
            let (got, detail) = verdict(skew);
            assert_eq!(got, status, "{skew}: {detail}");
        }
        assert_eq!(
            verdict(s(300)).1,
            "the API server's clock is 300s ahead of the local clock: kube-apiserver refuses a \
             notBefore more than 5 minutes off its clock, so it refuses every certificate podca \
             signs here; synchronise the clocks (NTP)"
        );
        assert_eq!(
            verdict(s(-45)).1,
            "the API server's clock is 45s behind the local clock: more than 30s; synchronise \
             the clocks (NTP)"
        );
    }
}
