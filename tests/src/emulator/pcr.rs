//! Typed views of PodCertificateRequest spec/status and the PCR rules of the
//! spec (§2.1–2.3, rules 1–19 and 31–37).

use super::errors::{FieldError, go_quote};
use super::keys::{self, PubKey};
use super::names;
use super::pem;
use base64::Engine as _;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

pub const MAX_KEY_MATERIAL: usize = 10 * 1024;
pub const MAX_CHAIN: usize = 100 * 1024;
pub const MIN_MAX_EXPIRATION: i64 = 3600;
pub const MAX_MAX_EXPIRATION: i64 = 91 * 24 * 3600;
pub const K8S_MAX_MAX_EXPIRATION: i64 = 86400;
pub const DEFAULT_MAX_EXPIRATION: i64 = 86400;

/// Which key-material rules a create is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRules {
    /// 1.35 v1beta1: pkixPublicKey + proofOfPossession only.
    LegacyOnly,
    /// 1.36 v1beta1: exactly one of stub or (pkix, pop).
    StubOrLegacy,
    /// v1: the stub is required.
    StubOnly,
}

/// Parse a `metav1.Time` JSON value. `Ok(None)` for null/absent.
pub fn parse_time(v: Option<&Value>) -> Result<Option<OffsetDateTime>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => OffsetDateTime::parse(s, &Rfc3339)
            .map(Some)
            .map_err(|e| format!("parsing time {}: {e}", go_quote(s))),
        Some(other) => Err(format!("cannot unmarshal {} into a time", kind_of(other))),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// RFC 3339 with whole seconds and `Z` (how metav1.Time serializes).
pub fn fmt_time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Go `time.Time` JSON (RFC 3339 with nanoseconds when non-zero), quoted.
fn fmt_time_nano_quoted(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let base = fmt_time(t);
    let ns = t.nanosecond();
    if ns == 0 {
        return format!("\"{base}\"");
    }
    let frac = format!("{ns:09}");
    let frac = frac.trim_end_matches('0');
    format!("\"{}.{}Z\"", &base[..base.len() - 1], frac)
}

fn get_str(m: &Map<String, Value>, k: &str) -> Result<String, String> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(o) => Err(format!(
            "json: cannot unmarshal {} into Go struct field of type string ({k})",
            kind_of(o)
        )),
    }
}

fn get_bytes(m: &Map<String, Value>, k: &str) -> Result<Vec<u8>, String> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| format!("illegal base64 data in {k}: {e}")),
        Some(o) => Err(format!(
            "json: cannot unmarshal {} into Go struct field of type []uint8 ({k})",
            kind_of(o)
        )),
    }
}

fn b64(b: &[u8]) -> Value {
    if b.is_empty() {
        Value::Null
    } else {
        Value::String(base64::engine::general_purpose::STANDARD.encode(b))
    }
}

/// The internal (hub) PodCertificateRequest spec.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PcrSpec {
    pub signer_name: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub service_account_name: String,
    pub service_account_uid: String,
    pub node_name: String,
    pub node_uid: String,
    pub max_expiration_seconds: Option<i64>,
    pub pkix_public_key: Vec<u8>,
    pub proof_of_possession: Vec<u8>,
    pub stub_pkcs10_request: Vec<u8>,
    pub unverified_user_annotations: Option<BTreeMap<String, String>>,
}

impl PcrSpec {
    /// Decode from JSON (any served version; absent fields are empty).
    pub fn from_json(v: Option<&Value>) -> Result<Self, String> {
        let empty = Map::new();
        let m = match v {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(m)) => m,
            Some(o) => return Err(format!("json: cannot unmarshal {} into spec", kind_of(o))),
        };
        let max = match m.get("maxExpirationSeconds") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => match n.as_i64() {
                Some(i) if i32::try_from(i).is_ok() => Some(i),
                _ => {
                    return Err(format!(
                        "json: cannot unmarshal number {n} into Go struct field PodCertificateRequestSpec.spec.maxExpirationSeconds of type int32"
                    ));
                }
            },
            Some(o) => {
                return Err(format!(
                    "json: cannot unmarshal {} into Go struct field PodCertificateRequestSpec.spec.maxExpirationSeconds of type int32",
                    kind_of(o)
                ));
            }
        };
        let ann = match m.get("unverifiedUserAnnotations") {
            None | Some(Value::Null) => None,
            Some(Value::Object(a)) => {
                let mut out = BTreeMap::new();
                for (k, v) in a {
                    match v {
                        Value::String(s) => {
                            out.insert(k.clone(), s.clone());
                        }
                        Value::Null => {
                            out.insert(k.clone(), String::new());
                        }
                        o => {
                            return Err(format!(
                                "json: cannot unmarshal {} into unverifiedUserAnnotations value",
                                kind_of(o)
                            ));
                        }
                    }
                }
                Some(out)
            }
            Some(o) => {
                return Err(format!(
                    "json: cannot unmarshal {} into unverifiedUserAnnotations",
                    kind_of(o)
                ));
            }
        };
        Ok(Self {
            signer_name: get_str(m, "signerName")?,
            pod_name: get_str(m, "podName")?,
            pod_uid: get_str(m, "podUID")?,
            service_account_name: get_str(m, "serviceAccountName")?,
            service_account_uid: get_str(m, "serviceAccountUID")?,
            node_name: get_str(m, "nodeName")?,
            node_uid: get_str(m, "nodeUID")?,
            max_expiration_seconds: max,
            pkix_public_key: get_bytes(m, "pkixPublicKey")?,
            proof_of_possession: get_bytes(m, "proofOfPossession")?,
            stub_pkcs10_request: get_bytes(m, "stubPKCS10Request")?,
            unverified_user_annotations: ann,
        })
    }

    /// The hub JSON form (all fields; used for storage).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("signerName".into(), json!(self.signer_name));
        m.insert("podName".into(), json!(self.pod_name));
        m.insert("podUID".into(), json!(self.pod_uid));
        m.insert(
            "serviceAccountName".into(),
            json!(self.service_account_name),
        );
        m.insert("serviceAccountUID".into(), json!(self.service_account_uid));
        m.insert("nodeName".into(), json!(self.node_name));
        m.insert("nodeUID".into(), json!(self.node_uid));
        if let Some(x) = self.max_expiration_seconds {
            m.insert("maxExpirationSeconds".into(), json!(x));
        }
        m.insert("pkixPublicKey".into(), b64(&self.pkix_public_key));
        m.insert("proofOfPossession".into(), b64(&self.proof_of_possession));
        m.insert("stubPKCS10Request".into(), b64(&self.stub_pkcs10_request));
        if let Some(a) = &self.unverified_user_annotations {
            m.insert("unverifiedUserAnnotations".into(), json!(a));
        }
        Value::Object(m)
    }

    /// The internal Go struct as `json.Marshal` prints it (for the
    /// spec-immutability message).
    pub fn go_struct_json(&self) -> String {
        let gb = |b: &[u8]| {
            if b.is_empty() {
                "null".to_string()
            } else {
                go_json_string(&base64::engine::general_purpose::STANDARD.encode(b))
            }
        };
        let ann = match &self.unverified_user_annotations {
            None => "null".to_string(),
            Some(a) => {
                let parts: Vec<String> = a
                    .iter()
                    .map(|(k, v)| format!("{}:{}", go_json_string(k), go_json_string(v)))
                    .collect();
                format!("{{{}}}", parts.join(","))
            }
        };
        format!(
            "{{\"SignerName\":{},\"PodName\":{},\"PodUID\":{},\"ServiceAccountName\":{},\"ServiceAccountUID\":{},\"NodeName\":{},\"NodeUID\":{},\"MaxExpirationSeconds\":{},\"PKIXPublicKey\":{},\"ProofOfPossession\":{},\"StubPKCS10Request\":{},\"UnverifiedUserAnnotations\":{}}}",
            go_json_string(&self.signer_name),
            go_json_string(&self.pod_name),
            go_json_string(&self.pod_uid),
            go_json_string(&self.service_account_name),
            go_json_string(&self.service_account_uid),
            go_json_string(&self.node_name),
            go_json_string(&self.node_uid),
            self.max_expiration_seconds
                .map_or_else(|| "null".to_string(), |x| x.to_string()),
            gb(&self.pkix_public_key),
            gb(&self.proof_of_possession),
            gb(&self.stub_pkcs10_request),
            ann
        )
    }

    /// The requested public key: from the stub if set, else pkixPublicKey.
    pub fn requested_key(&self) -> Result<PubKey, String> {
        if !self.stub_pkcs10_request.is_empty() {
            let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(
                &self.stub_pkcs10_request,
            )
            .map_err(|e| e.to_string())?;
            keys::pubkey_from_spki(&csr.certification_request_info.subject_pki)
        } else {
            keys::parse_spki(&self.pkix_public_key)
        }
    }
}

use x509_parser::prelude::FromDer;

/// Go `json.Marshal` of a string (HTML-safe escaping).
pub fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `metav1.Condition`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Condition {
    pub typ: String,
    pub status: String,
    pub observed_generation: i64,
    pub last_transition_time: Option<OffsetDateTime>,
    pub reason: String,
    pub message: String,
}

/// The PodCertificateRequest status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PcrStatus {
    pub conditions: Vec<Condition>,
    pub certificate_chain: String,
    pub not_before: Option<OffsetDateTime>,
    pub not_after: Option<OffsetDateTime>,
    pub begin_refresh_at: Option<OffsetDateTime>,
}

impl PcrStatus {
    pub fn from_json(v: Option<&Value>) -> Result<Self, String> {
        let empty = Map::new();
        let m = match v {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(m)) => m,
            Some(o) => return Err(format!("json: cannot unmarshal {} into status", kind_of(o))),
        };
        let mut conditions = Vec::new();
        match m.get("conditions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) => {
                for c in a {
                    let Value::Object(cm) = c else {
                        return Err(
                            "json: cannot unmarshal into Go struct field of type v1.Condition"
                                .into(),
                        );
                    };
                    let og = match cm.get("observedGeneration") {
                        None | Some(Value::Null) => 0,
                        Some(Value::Number(n)) => n
                            .as_i64()
                            .ok_or_else(|| "observedGeneration must be an integer".to_string())?,
                        Some(o) => {
                            return Err(format!(
                                "cannot unmarshal {} into observedGeneration",
                                kind_of(o)
                            ));
                        }
                    };
                    conditions.push(Condition {
                        typ: get_str(cm, "type")?,
                        status: get_str(cm, "status")?,
                        observed_generation: og,
                        last_transition_time: parse_time(cm.get("lastTransitionTime"))?,
                        reason: get_str(cm, "reason")?,
                        message: get_str(cm, "message")?,
                    });
                }
            }
            Some(o) => {
                return Err(format!(
                    "json: cannot unmarshal {} into conditions",
                    kind_of(o)
                ));
            }
        }
        Ok(Self {
            conditions,
            certificate_chain: get_str(m, "certificateChain")?,
            not_before: parse_time(m.get("notBefore"))?,
            not_after: parse_time(m.get("notAfter"))?,
            begin_refresh_at: parse_time(m.get("beginRefreshAt"))?,
        })
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if !self.conditions.is_empty() {
            let cs: Vec<Value> = self
                .conditions
                .iter()
                .map(|c| {
                    let mut cm = Map::new();
                    cm.insert("type".into(), json!(c.typ));
                    cm.insert("status".into(), json!(c.status));
                    if c.observed_generation != 0 {
                        cm.insert("observedGeneration".into(), json!(c.observed_generation));
                    }
                    cm.insert(
                        "lastTransitionTime".into(),
                        c.last_transition_time
                            .map_or(Value::Null, |t| json!(fmt_time(t))),
                    );
                    cm.insert("reason".into(), json!(c.reason));
                    cm.insert("message".into(), json!(c.message));
                    Value::Object(cm)
                })
                .collect();
            m.insert("conditions".into(), Value::Array(cs));
        }
        if !self.certificate_chain.is_empty() {
            m.insert("certificateChain".into(), json!(self.certificate_chain));
        }
        if let Some(t) = self.not_before {
            m.insert("notBefore".into(), json!(fmt_time(t)));
        }
        if let Some(t) = self.begin_refresh_at {
            m.insert("beginRefreshAt".into(), json!(fmt_time(t)));
        }
        if let Some(t) = self.not_after {
            m.insert("notAfter".into(), json!(fmt_time(t)));
        }
        Value::Object(m)
    }

    fn has(&self, typ: &str) -> bool {
        self.conditions
            .iter()
            .any(|c| c.typ == typ && c.status == "True")
    }
    pub fn is_issued(&self) -> bool {
        self.has("Issued")
    }
    pub fn is_denied(&self) -> bool {
        self.has("Denied")
    }
    pub fn is_failed(&self) -> bool {
        self.has("Failed")
    }
    pub fn is_terminal(&self) -> bool {
        self.is_issued() || self.is_denied() || self.is_failed()
    }
}

/// Rules 2–9 (validation part; NodeRestriction is admission, elsewhere).
pub fn validate_create(
    name: &str,
    generate_name: &str,
    spec: &PcrSpec,
    rules: KeyRules,
    pod_certificate_mldsa: bool,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    // metadata
    if name.is_empty() && generate_name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else if !name.is_empty() {
        for m in names::name_is_dns_subdomain(name, false) {
            errs.push(FieldError::invalid_str("metadata.name", name, m));
        }
    } else {
        for m in names::name_is_dns_subdomain(generate_name, true) {
            errs.push(FieldError::invalid_str(
                "metadata.generateName",
                generate_name,
                m,
            ));
        }
    }
    errs.extend(names::validate_signer_name(
        "spec.signerName",
        &spec.signer_name,
    ));
    if let Some(a) = &spec.unverified_user_annotations {
        let mut total = 0usize;
        for (k, v) in a {
            total += k.len() + v.len();
            let key_errs = names::is_qualified_name(&k.to_lowercase());
            for m in key_errs {
                errs.push(FieldError::invalid_str(
                    "spec.unverifiedUserAnnotations",
                    k,
                    m,
                ));
            }
            if !k.contains('/') {
                errs.push(FieldError::invalid_str(
                    "spec.unverifiedUserAnnotations",
                    k,
                    "must be a domain-prefixed key (such as \"acme.io/foo\")",
                ));
            }
        }
        if total > 256 * 1024 {
            errs.push(FieldError::too_long(
                "spec.unverifiedUserAnnotations",
                256 * 1024,
            ));
        }
    }
    let dns = |errs: &mut Vec<FieldError>, path: &str, v: &str| {
        for m in names::is_dns1123_subdomain(v) {
            errs.push(FieldError::invalid_str(path, v, m));
        }
    };
    let uid = |errs: &mut Vec<FieldError>, path: &str, v: &str| {
        if v.is_empty() {
            errs.push(FieldError::invalid_str(path, v, "must not be empty"));
        }
        if v.len() > 128 {
            errs.push(FieldError::too_long(path, 128));
        }
    };
    dns(&mut errs, "spec.podName", &spec.pod_name);
    uid(&mut errs, "spec.podUID", &spec.pod_uid);
    dns(
        &mut errs,
        "spec.serviceAccountName",
        &spec.service_account_name,
    );
    uid(
        &mut errs,
        "spec.serviceAccountUID",
        &spec.service_account_uid,
    );
    dns(&mut errs, "spec.nodeName", &spec.node_name);
    uid(&mut errs, "spec.nodeUID", &spec.node_uid);

    let Some(max) = spec.max_expiration_seconds else {
        errs.push(FieldError::required(
            "spec.maxExpirationSeconds",
            "must be set",
        ));
        return errs;
    };
    let upper = if names::is_kubernetes_signer_name(&spec.signer_name) {
        K8S_MAX_MAX_EXPIRATION
    } else {
        MAX_MAX_EXPIRATION
    };
    if !(MIN_MAX_EXPIRATION..=upper).contains(&max) {
        errs.push(FieldError::invalid_raw(
            "spec.maxExpirationSeconds",
            max.to_string(),
            format!("must be in the range [{MIN_MAX_EXPIRATION}, {upper}]"),
        ));
    }

    let has_stub = !spec.stub_pkcs10_request.is_empty();
    let has_legacy = !spec.pkix_public_key.is_empty() || !spec.proof_of_possession.is_empty();
    match rules {
        KeyRules::LegacyOnly => validate_legacy(spec, &mut errs),
        KeyRules::StubOnly => {
            if !has_stub {
                errs.push(FieldError::required(
                    "spec.stubPKCS10Request",
                    "must be set",
                ));
            } else {
                validate_stub(spec, pod_certificate_mldsa, &mut errs);
            }
        }
        KeyRules::StubOrLegacy => {
            if has_stub == has_legacy {
                errs.push(FieldError::invalid_omitted(
                    "spec",
                    "exactly one of (stubPKCS10Request) or (pkixPublicKey, proofOfPossession) must be set",
                ));
            } else if has_stub {
                validate_stub(spec, pod_certificate_mldsa, &mut errs);
            } else {
                validate_legacy(spec, &mut errs);
            }
        }
    }
    errs
}

const PKIX: &str = "spec.pkixPublicKey";
const POP: &str = "spec.proofOfPossession";
const STUB: &str = "spec.stubPKCS10Request";

fn json_bytes(b: &[u8]) -> String {
    if b.is_empty() {
        "null".to_string()
    } else {
        go_json_string(&base64::engine::general_purpose::STANDARD.encode(b))
    }
}

fn validate_legacy(spec: &PcrSpec, errs: &mut Vec<FieldError>) {
    if spec.pkix_public_key.len() > MAX_KEY_MATERIAL {
        errs.push(FieldError::too_long(PKIX, MAX_KEY_MATERIAL));
        return;
    }
    if spec.proof_of_possession.len() > MAX_KEY_MATERIAL {
        errs.push(FieldError::too_long(POP, MAX_KEY_MATERIAL));
        return;
    }
    let key = match keys::parse_spki(&spec.pkix_public_key) {
        Ok(k) => k,
        Err(_) => {
            errs.push(FieldError::invalid_raw(
                PKIX,
                json_bytes(&spec.pkix_public_key),
                "must be a valid PKIX-serialized public key",
            ));
            return;
        }
    };
    // Rule 8.10: ML-DSA only in the stub, gate or not.
    if let Err((val, detail)) = keys::check_key_type(&key, false) {
        match val {
            Some(v) => errs.push(FieldError::invalid_str(PKIX, &v, detail)),
            None => errs.push(FieldError::invalid_raw(
                PKIX,
                json_bytes(&spec.pkix_public_key),
                detail,
            )),
        }
        return;
    }
    if !keys::verify_pop(
        &spec.pkix_public_key,
        &spec.pod_uid,
        &spec.proof_of_possession,
    ) {
        errs.push(FieldError::invalid_omitted(
            POP,
            "could not verify proof-of-possession signature",
        ));
    }
}

fn validate_stub(spec: &PcrSpec, pod_certificate_mldsa: bool, errs: &mut Vec<FieldError>) {
    let stub = &spec.stub_pkcs10_request;
    if stub.len() > MAX_KEY_MATERIAL {
        errs.push(FieldError::too_long(STUB, MAX_KEY_MATERIAL));
        return;
    }
    let csr = match x509_parser::certification_request::X509CertificationRequest::from_der(stub) {
        Ok(([], csr)) => csr,
        _ => {
            errs.push(FieldError::invalid_omitted(
                STUB,
                "must be a valid PKCS#10 CSR",
            ));
            return;
        }
    };
    let key = match keys::pubkey_from_spki(&csr.certification_request_info.subject_pki) {
        Ok(k) => k,
        Err(_) => {
            errs.push(FieldError::invalid_omitted(
                STUB,
                "must be a valid PKCS#10 CSR",
            ));
            return;
        }
    };
    if let Err((val, detail)) = keys::check_key_type(&key, pod_certificate_mldsa) {
        match val {
            Some(v) => errs.push(FieldError::invalid_str(STUB, &v, detail)),
            None => errs.push(FieldError::invalid_omitted(STUB, detail)),
        }
        return;
    }
    if !keys::verify_csr_signature(&csr) {
        errs.push(FieldError::invalid_omitted(STUB, "invalid signature"));
    }
}

/// Rule 10: main-resource update (spec immutable). `new_spec` is what the
/// caller sent after patching.
pub fn validate_update(new_spec: &PcrSpec, old_spec: &PcrSpec) -> Vec<FieldError> {
    if new_spec != old_spec {
        return vec![FieldError::invalid_raw(
            "spec",
            new_spec.go_struct_json(),
            "field is immutable",
        )];
    }
    Vec::new()
}

fn cond_path(i: usize, f: &str) -> String {
    format!("status.conditions.[{i}].{f}")
}

/// Generic `metav1validation.ValidateConditions` (rules 31–37).
pub fn validate_conditions(conds: &[Condition], base: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, c) in conds.iter().enumerate() {
        let p = |f: &str| format!("{base}[{i}].{f}");
        for m in names::is_qualified_name(&c.typ) {
            errs.push(FieldError::invalid_str(&p("type"), &c.typ, m));
        }
        if !matches!(c.status.as_str(), "True" | "False" | "Unknown") {
            errs.push(FieldError::not_supported(
                &p("status"),
                &c.status,
                &["False", "True", "Unknown"],
            ));
        }
        if c.observed_generation < 0 {
            errs.push(FieldError::invalid_raw(
                &p("observedGeneration"),
                c.observed_generation.to_string(),
                "must be greater than or equal to zero",
            ));
        }
        if c.last_transition_time
            .is_none_or(|t| t.unix_timestamp() == -62135596800)
        {
            errs.push(FieldError::required(&p("lastTransitionTime"), ""));
        }
        if c.reason.is_empty() {
            errs.push(FieldError::required(&p("reason"), ""));
        } else {
            if !names::is_valid_condition_reason(&c.reason) {
                errs.push(FieldError::invalid_str(
                    &p("reason"),
                    &c.reason,
                    names::CONDITION_REASON_MSG,
                ));
            }
            if c.reason.len() > 1024 {
                errs.push(FieldError::too_long(&p("reason"), 1024));
            }
        }
        if c.message.len() > 32768 {
            errs.push(FieldError::too_long(&p("message"), 32768));
        }
        if !seen.insert(c.typ.clone()) {
            errs.push(FieldError::duplicate(&p("type"), &c.typ));
        }
    }
    errs
}

/// A parsed leaf certificate's relevant parts.
struct Leaf {
    key: Result<PubKey, String>,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    dns: Vec<String>,
    emails: Vec<String>,
}

fn parse_cert(der: &[u8]) -> Option<Leaf> {
    use x509_parser::extensions::GeneralName;
    let (rest, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    if !rest.is_empty() {
        return None;
    }
    // Go rejects an outer/inner signature algorithm mismatch.
    if cert.signature_algorithm.algorithm != cert.tbs_certificate.signature.algorithm {
        return None;
    }
    let mut dns = Vec::new();
    let mut emails = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => dns.push((*d).to_string()),
                GeneralName::RFC822Name(e) => emails.push((*e).to_string()),
                _ => {}
            }
        }
    }
    Some(Leaf {
        key: keys::pubkey_from_spki(cert.public_key()),
        not_before: cert.validity().not_before.to_datetime(),
        not_after: cert.validity().not_after.to_datetime(),
        dns,
        emails,
    })
}

/// Rules 11–17 (`ValidatePodCertificateRequestStatusUpdate`).
pub fn validate_status_update(
    new: &PcrStatus,
    old: &PcrStatus,
    spec: &PcrSpec,
    now: OffsetDateTime,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut known = 0;
    for (i, c) in new.conditions.iter().enumerate() {
        match c.typ.as_str() {
            "Issued" | "Denied" | "Failed" => {
                known += 1;
                if known > 1 {
                    errs.push(FieldError::invalid_str(
                        &cond_path(i, "type"),
                        &c.typ,
                        "There may be at most one condition with type \"Issued\", \"Denied\", or \"Failed\"",
                    ));
                }
                if c.status != "True" {
                    errs.push(FieldError::not_supported(
                        &cond_path(i, "status"),
                        &c.status,
                        &["True"],
                    ));
                }
            }
            _ => errs.push(FieldError::not_supported(
                &cond_path(i, "type"),
                &c.typ,
                &["Issued", "Denied", "Failed"],
            )),
        }
    }
    errs.extend(validate_conditions(&new.conditions, "status.conditions"));
    if !errs.is_empty() {
        return errs;
    }

    if old.is_terminal() {
        if new != old {
            errs.push(FieldError::invalid_omitted(
                "status",
                "immutable after PodCertificateRequest is issued, denied, or failed",
            ));
        }
        return errs;
    }

    if new.is_denied() || new.is_failed() {
        let want = PcrStatus {
            conditions: new.conditions.clone(),
            ..Default::default()
        };
        if *new != want {
            errs.push(FieldError::invalid_omitted(
                "status",
                "non-condition status fields must be empty when denying or failing the PodCertificateRequest",
            ));
        }
        return errs;
    }

    if new.is_issued() {
        validate_issued(new, spec, now, &mut errs);
        return errs;
    }

    if new != old {
        errs.push(FieldError::invalid_omitted(
            "status",
            "status is immutable unless transitioning to \"Issued\", \"Denied\", or \"Failed\"",
        ));
    }
    errs
}

const CHAIN: &str = "status.certificateChain";

fn validate_issued(
    new: &PcrStatus,
    spec: &PcrSpec,
    now: OffsetDateTime,
    errs: &mut Vec<FieldError>,
) {
    let chain = &new.certificate_chain;
    if chain.len() > MAX_CHAIN {
        errs.push(FieldError::too_long(CHAIN, MAX_CHAIN));
        return;
    }
    let Some((leaf_block, mut rest)) = pem::decode(chain.as_bytes()) else {
        errs.push(FieldError::invalid_str(
            CHAIN,
            chain,
            "issued certificate chain must contain at least one certificate",
        ));
        return;
    };
    if leaf_block.typ != "CERTIFICATE" {
        errs.push(FieldError::invalid_str(
            CHAIN,
            chain,
            "issued certificate chain must consist entirely of CERTIFICATE PEM blocks",
        ));
        return;
    }
    let Some(leaf) = parse_cert(&leaf_block.bytes) else {
        errs.push(FieldError::invalid_str(
            CHAIN,
            chain,
            "leaf certificate does not parse as valid X.509",
        ));
        return;
    };
    for d in &leaf.dns {
        if d.is_empty() {
            errs.push(FieldError::invalid_str(
                CHAIN,
                d,
                "leaf certificate should not contain empty DNSName",
            ));
        }
        if d.contains("..") {
            errs.push(FieldError::invalid_str(
                CHAIN,
                d,
                "leaf certificate's DNSName should not contain '..'",
            ));
        }
        if d.starts_with('.') || d.ends_with('.') {
            errs.push(FieldError::invalid_str(
                CHAIN,
                d,
                "leaf certificate's DNSName should not start or end with '.'",
            ));
        }
    }
    for e in &leaf.emails {
        if !names::parse_mail_address(e) {
            errs.push(FieldError::invalid_str(
                CHAIN,
                e,
                "leaf certificate should not contain invalid EmailAddress",
            ));
        }
    }
    // (Upstream keeps going after SAN errors; the key check comes next.)
    let want = match spec.requested_key() {
        Ok(k) => k,
        Err(_) => {
            if spec.stub_pkcs10_request.is_empty() {
                errs.push(FieldError::invalid_raw(
                    PKIX,
                    json_bytes(&spec.pkix_public_key),
                    "must be a valid PKIX-serialized public key",
                ));
            } else {
                errs.push(FieldError::invalid_omitted(
                    STUB,
                    "must be a valid PKCS#10 CSR",
                ));
            }
            return;
        }
    };
    let leaf_key_ok = leaf.key.as_ref().is_ok_and(|k| keys::same_key(&want, k));
    if !leaf_key_ok {
        errs.push(FieldError::invalid_str(
            CHAIN,
            chain,
            "leaf certificate was not issued to the requested public key",
        ));
        return;
    }
    if new.not_before.is_none() {
        errs.push(FieldError::required(
            "status.notBefore",
            "must be present and consistent with the issued certificate",
        ));
    }
    if new.not_after.is_none() {
        errs.push(FieldError::required(
            "status.notAfter",
            "must be present and consistent with the issued certificate",
        ));
    }
    if new.begin_refresh_at.is_none() {
        errs.push(FieldError::required(
            "status.beginRefreshAt",
            "must be present and in the range [notbefore+10min, notafter-10min]",
        ));
    }
    if !errs.is_empty() {
        return;
    }
    let (Some(nb), Some(na), Some(bra)) = (new.not_before, new.not_after, new.begin_refresh_at)
    else {
        return;
    };
    if nb != leaf.not_before {
        errs.push(FieldError::invalid_raw(
            "status.notBefore",
            fmt_time_nano_quoted(nb),
            "must be set to the NotBefore time encoded in the leaf certificate",
        ));
        return;
    }
    let skew = time::Duration::minutes(5);
    if !(nb > now - skew && nb < now + skew) {
        errs.push(FieldError::invalid_raw(
            "status.notBefore",
            fmt_time_nano_quoted(nb),
            "must be set to within 5 minutes of kube-apiserver's current time",
        ));
        return;
    }
    if na != leaf.not_after {
        errs.push(FieldError::invalid_raw(
            "status.notAfter",
            fmt_time_nano_quoted(na),
            "must be set to the NotAfter time encoded in the leaf certificate",
        ));
        return;
    }
    let lifetime = leaf.not_after - leaf.not_before;
    let lifetime_ns = lifetime.whole_nanoseconds().to_string();
    if lifetime < time::Duration::hours(1) {
        errs.push(FieldError::invalid_raw(
            CHAIN,
            lifetime_ns,
            "leaf certificate lifetime must be >= 1 hour",
        ));
        return;
    }
    let max = spec
        .max_expiration_seconds
        .unwrap_or(DEFAULT_MAX_EXPIRATION);
    if lifetime > time::Duration::seconds(max) {
        errs.push(FieldError::invalid_raw(
            CHAIN,
            lifetime_ns,
            format!("leaf certificate lifetime must be <= spec.maxExpirationSeconds ({max})"),
        ));
        return;
    }
    if bra < nb + time::Duration::minutes(10) {
        errs.push(FieldError::invalid_raw(
            "status.beginRefreshAt",
            fmt_time_nano_quoted(bra),
            "must be at least 10 minutes after status.notBefore",
        ));
        return;
    }
    if bra > na - time::Duration::minutes(10) {
        errs.push(FieldError::invalid_raw(
            "status.beginRefreshAt",
            fmt_time_nano_quoted(bra),
            "must be at least 10 minutes before status.notAfter",
        ));
        return;
    }
    while let Some((block, r)) = pem::decode(rest) {
        rest = r;
        if block.typ != "CERTIFICATE" {
            errs.push(FieldError::invalid_str(
                CHAIN,
                chain,
                "issued certificate chain must consist entirely of CERTFICATE PEM blocks",
            ));
            return;
        }
        if parse_cert(&block.bytes).is_none() {
            errs.push(FieldError::invalid_str(
                CHAIN,
                chain,
                "intermediate certificate does not parse as valid X.509",
            ));
            return;
        }
    }
}

/// Rules 24–27: `validateTrustBundle`.
pub fn validate_trust_bundle(bundle: &str) -> Vec<FieldError> {
    const P: &str = "spec.trustBundle";
    const OMIT: &str = "\"<value omitted>\"";
    let mut errs = Vec::new();
    if bundle.len() > 1024 * 1024 {
        errs.push(FieldError::too_long(P, 1024 * 1024));
        return errs;
    }
    let mut dedupe: Vec<(Vec<u8>, Vec<usize>)> = Vec::new();
    for (i, b) in pem::decode_all(bundle.as_bytes()).into_iter().enumerate() {
        if b.typ != "CERTIFICATE" {
            errs.push(FieldError::invalid_raw(
                P,
                OMIT,
                format!("entry {i} has bad block type: {}", b.typ),
            ));
            continue;
        }
        if !b.headers.is_empty() {
            errs.push(FieldError::invalid_raw(
                P,
                OMIT,
                format!("entry {i} has PEM block headers"),
            ));
            continue;
        }
        let parsed = x509_parser::certificate::X509Certificate::from_der(&b.bytes);
        let cert = match parsed {
            Ok(([], c)) => c,
            _ => {
                errs.push(FieldError::invalid_raw(
                    P,
                    OMIT,
                    format!("entry {i} does not parse as X.509"),
                ));
                continue;
            }
        };
        let bc = cert.basic_constraints().ok().flatten();
        if !bc.is_some_and(|bc| bc.value.ca) {
            errs.push(FieldError::invalid_raw(
                P,
                OMIT,
                format!("entry {i} does not have the CA bit set"),
            ));
            continue;
        }
        match dedupe.iter_mut().find(|(der, _)| *der == b.bytes) {
            Some((_, idx)) => idx.push(i),
            None => dedupe.push((b.bytes, vec![i])),
        }
    }
    if !errs.is_empty() {
        return errs;
    }
    if dedupe.is_empty() {
        errs.push(FieldError::invalid_raw(
            P,
            OMIT,
            "at least one trust anchor must be provided",
        ));
    }
    for (_, idx) in &dedupe {
        if idx.len() > 1 {
            let list: Vec<String> = idx.iter().map(ToString::to_string).collect();
            errs.push(FieldError::invalid_raw(
                P,
                OMIT,
                format!("duplicate trust anchor (indices [{}])", list.join(" ")),
            ));
        }
    }
    errs
}
