//! The HTTP layer: routing, authentication, discovery and the handlers.

use super::auth::{Attrs, Decision, UserInfo, forbidden_message};
use super::errors::{ApiError, FieldError};
use super::managed;
use super::patch;
use super::pcr::{self, KeyRules, PcrSpec, PcrStatus};
use super::resources::{self, ApiMode, Res};
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{Event, EventType, meta_str, obj_rv};
use super::{Shared, lock, new_uid, read};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

pub(crate) type RespBody = BoxBody<Bytes, Infallible>;

const MAX_BODY: usize = 16 * 1024 * 1024;

/// A streaming body fed by a channel (watch responses).
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .rx
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

pub(crate) fn spawn_server(shared: Arc<Shared>, listener: tokio::net::TcpListener) {
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = shared.shutdown.notified() => break,
            };
            if lock(&shared.addr).is_none() {
                break;
            }
            let Ok((stream, _)) = accepted else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let s = shared.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let s = s.clone();
                    async move { Ok::<_, Infallible>(handle(s, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

fn json_response(code: u16, v: &Value) -> Response<RespBody> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response<RespBody> {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(v) = hyper::header::HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(hyper::header::RETRY_AFTER, v);
    }
    r
}

/// One parsed request.
struct Req {
    method: Method,
    path: String,
    query: HashMap<String, String>,
    content_type: String,
    user_agent: String,
    body: Bytes,
    user: Option<UserInfo>,
}

impl Req {
    fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.q(k), Some("true" | "1"))
    }
    fn manager(&self) -> String {
        if let Some(m) = self.q("fieldManager").filter(|m| !m.is_empty()) {
            return m.to_string();
        }
        let ua = self.user_agent.split('/').next().unwrap_or("").trim();
        if ua.is_empty() {
            "unknown".to_string()
        } else {
            ua.chars().take(128).collect()
        }
    }
    fn dry_run(&self) -> bool {
        self.q("dryRun") == Some("All")
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<RespBody> {
    shared.count(|c| c.requests += 1);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query: HashMap<String, String> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let header = |n: hyper::header::HeaderName| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let content_type = header(hyper::header::CONTENT_TYPE);
    let user_agent = header(hyper::header::USER_AGENT);
    let authz = header(hyper::header::AUTHORIZATION);
    let imp_user = req
        .headers()
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let imp_groups: Vec<String> = req
        .headers()
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(String::from))
        .collect();
    let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));

    let (delay, fault) = shared.faults_for(method.as_str(), &path, is_watch);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }

    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                "the request body is too large",
            ));
        }
    };

    // Authentication.
    let user = authenticate(&shared, &authz).map(|u| match (&imp_user, u.is_admin()) {
        (Some(name), true) => {
            let g: Vec<&str> = imp_groups.iter().map(String::as_str).collect();
            UserInfo::new(name, &g)
        }
        _ => u,
    });
    let r = Req {
        method,
        path,
        query,
        content_type,
        user_agent,
        body,
        user,
    };

    if let Some(code) = fault {
        shared.count(|c| c.injected_faults += 1);
        return error_response(&injected(code, &r.path));
    }

    match route(&shared, &r).await {
        Ok(resp) => resp,
        Err(e) => {
            shared.count(|c| match e.code {
                422 => {
                    c.validation_rejections += 1;
                    let kind = e
                        .details
                        .as_ref()
                        .map(|d| d.kind.clone())
                        .unwrap_or_default();
                    for cause in e.details.iter().flat_map(|d| d.causes.iter()) {
                        *c.rejections_by_cause
                            .entry(format!(
                                "{kind} {} {}",
                                cause.field,
                                cause.kind.cause_reason()
                            ))
                            .or_default() += 1;
                    }
                }
                403 => c.forbidden += 1,
                409 => c.conflicts += 1,
                404 => c.not_found += 1,
                _ => c.other_errors += 1,
            });
            error_response(&e)
        }
    }
}

fn injected(code: u16, path: &str) -> ApiError {
    match code {
        409 => ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {path}: the object has been modified; please apply your changes to the latest version and try again"
            ),
        ),
        429 => {
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                "too many requests, please try again later (injected)",
            );
            e.retry_after = Some(1);
            e
        }
        500 => ApiError::internal("Internal error occurred: injected fault"),
        503 => ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request (injected)",
        ),
        504 => ApiError::new(
            504,
            "Timeout",
            "the server was unable to return a response in the time allotted (injected)",
        ),
        c => ApiError::new(c, "", format!("injected fault {c}")),
    }
}

fn authenticate(shared: &Shared, header: &str) -> Option<UserInfo> {
    let token = header.strip_prefix("Bearer ")?.trim();
    let a = read(&shared.auth);
    if let Some((_, u)) = a.tokens.get(token) {
        return Some(u.clone());
    }
    let t = a.sa_tokens.get(token)?;
    let now = shared.now();
    if now >= t.expires {
        return None;
    }
    if !t
        .audiences
        .iter()
        .any(|x| shared.config.api_audiences.contains(x))
    {
        return None;
    }
    Some(t.user())
}

/// A parsed resource path.
#[derive(Debug, Clone)]
struct Target {
    res: Res,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

async fn route(shared: &Arc<Shared>, r: &Req) -> Result<Response<RespBody>, ApiError> {
    let segs: Vec<&str> = r
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let mode = shared.config.api_mode;
    match segs.as_slice() {
        ["version"] => return Ok(json_response(200, &version_info())),
        ["healthz"] | ["livez"] | ["readyz"] => {
            let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")).boxed());
            resp.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain"),
            );
            return Ok(resp);
        }
        _ => {}
    }
    let Some(user) = r.user.clone() else {
        return Err(ApiError::new(401, "Unauthorized", "Unauthorized"));
    };
    match segs.as_slice() {
        ["api"] => {
            return Ok(json_response(
                200,
                &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
            ));
        }
        ["apis"] => return Ok(json_response(200, &api_group_list(mode))),
        ["api", "v1"] => return Ok(json_response(200, &resource_list("", "v1", mode))),
        ["apis", g] => {
            return api_group(g, mode)
                .map(|v| json_response(200, &v))
                .ok_or_else(|| not_found_path(&r.path));
        }
        ["apis", g, v] => {
            if api_group(g, mode).is_some_and(|gv| group_has_version(&gv, v)) {
                return Ok(json_response(200, &resource_list(g, v, mode)));
            }
            return Err(not_found_path(&r.path));
        }
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] => {
            return token_review(shared, r, &user);
        }
        _ => {}
    }
    let target = parse_target(&segs, mode).ok_or_else(|| not_found_path(&r.path))?;
    dispatch(shared, r, &user, &target).await
}

fn not_found_path(path: &str) -> ApiError {
    let _ = path;
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn parse_target(segs: &[&str], mode: ApiMode) -> Option<Target> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest): (Option<String>, &[&str]) = match rest {
        ["namespaces", ns, r, tail @ ..] => {
            let _ = r;
            (Some((*ns).to_string()), &rest[2..tail.len() + 3])
        }
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some((*n).to_string()), None),
        [p, n, s] => (*p, Some((*n).to_string()), Some((*s).to_string())),
        _ => return None,
    };
    // `/api/v1/namespaces/<name>` is the namespace object itself.
    let (res, namespace, name) =
        if group.is_empty() && namespace.is_none() && plural == "namespaces" {
            (Res::Namespace, None, name)
        } else if group.is_empty() && plural == "namespaces" {
            return None;
        } else {
            (Res::lookup(group, plural)?, namespace, name)
        };
    if group.is_empty() && segs.len() == 4 && segs[2] == "namespaces" {
        // /api/v1/namespaces/<ns>: handled above via (namespaces, name)
    }
    if !res.versions(mode).contains(&version) {
        return None;
    }
    if res.namespaced() != namespace.is_some()
        && !(res.namespaced() && name.is_none() && namespace.is_none())
    {
        return None;
    }
    if let Some(s) = &sub
        && (s != "status" || !res.has_status())
    {
        return None;
    }
    Some(Target {
        res,
        version: version.to_string(),
        namespace,
        name,
        sub,
    })
}

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "36",
        "emulationMajor": "1",
        "emulationMinor": "36",
        "gitVersion": "v1.36.2-podca-emulator",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.26",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

fn groups(mode: ApiMode) -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("certificates.k8s.io", mode.cert_versions().to_vec()),
        ("coordination.k8s.io", vec!["v1"]),
        ("events.k8s.io", vec!["v1"]),
        ("authentication.k8s.io", vec!["v1"]),
    ]
}

fn api_group_json(name: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"name": name, "versions": vs, "preferredVersion": preferred})
}

fn api_group_list(mode: ApiMode) -> Value {
    let gs: Vec<Value> = groups(mode)
        .iter()
        .map(|(g, vs)| api_group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

fn api_group(g: &str, mode: ApiMode) -> Option<Value> {
    groups(mode)
        .into_iter()
        .find(|(n, _)| *n == g)
        .map(|(n, vs)| {
            let mut v = api_group_json(n, &vs);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            v
        })
}

fn group_has_version(g: &Value, v: &str) -> bool {
    g["versions"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["version"] == v))
}

const ALL_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn resource_list(group: &str, version: &str, mode: ApiMode) -> Value {
    let mut rs = Vec::new();
    for res in Res::ALL {
        if res.group() != group || !res.versions(mode).contains(&version) {
            continue;
        }
        if res == Res::CoreEvent && !group.is_empty() {
            continue;
        }
        rs.push(json!({
            "name": res.plural(),
            "singularName": res.singular(),
            "namespaced": res.namespaced(),
            "kind": res.kind(),
            "verbs": ALL_VERBS,
        }));
        if res.has_status() {
            rs.push(json!({
                "name": format!("{}/status", res.plural()),
                "singularName": "",
                "namespaced": res.namespaced(),
                "kind": res.kind(),
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if group == "authentication.k8s.io" {
        rs.push(json!({"name": "tokenreviews", "singularName": "tokenreview", "namespaced": false, "kind": "TokenReview", "verbs": ["create"]}));
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": rs})
}

fn authorize(shared: &Shared, user: &UserInfo, a: Attrs<'_>) -> Result<(), ApiError> {
    match read(&shared.auth).authorize(user, &a) {
        Decision::Allow => Ok(()),
        Decision::Deny(reason) => Err(ApiError::forbidden(
            a.resource,
            a.group,
            a.name,
            &forbidden_message(user, &a, &reason),
        )),
    }
}

async fn dispatch(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
) -> Result<Response<RespBody>, ApiError> {
    let verb = match (&r.method, t.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if r.flag("watch") => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource".to_string(),
            ));
        }
    };
    let ns = t.namespace.clone().unwrap_or_default();
    let mut name = t.name.clone().unwrap_or_default();
    // kube-apiserver's RequestInfoFactory: a list or watch with the field selector
    // `metadata.name=<name>` is authorized as a request for that name (resourceNames apply).
    if name.is_empty()
        && matches!(verb, "list" | "watch")
        && let Ok(fsel) = FieldSelector::parse(r.q("fieldSelector").unwrap_or(""), t.res)
        && let Some(n) = fsel.required("metadata.name")
    {
        name = n.to_string();
    }
    if t.res.namespaced() && ns.is_empty() && !matches!(verb, "list" | "watch") {
        return Err(not_found_path(&r.path));
    }
    authorize(
        shared,
        user,
        Attrs {
            verb,
            group: t.res.group(),
            resource: t.res.plural(),
            subresource: t.sub.as_deref().unwrap_or(""),
            namespace: &ns,
            name: &name,
        },
    )?;
    match verb {
        "get" => get(shared, t),
        "list" => list(shared, r, t),
        "watch" => watch(shared, r, t),
        "create" => create(shared, r, user, t),
        "update" | "patch" => update(shared, r, user, t, verb),
        "delete" => delete(shared, r, t),
        _ => delete_collection(shared, r, t),
    }
}

fn mode(shared: &Shared) -> ApiMode {
    shared.config.api_mode
}

fn get(shared: &Shared, t: &Target) -> Result<Response<RespBody>, ApiError> {
    let ns = t.namespace.as_deref().unwrap_or("");
    let name = t.name.as_deref().unwrap_or("");
    let obj = lock(&shared.store)
        .get(t.res, ns, name)
        .ok_or_else(|| ApiError::not_found(t.res.plural(), t.res.group(), name))?;
    Ok(json_response(
        200,
        &resources::to_version(t.res, &obj, &t.version, mode(shared)),
    ))
}

fn selectors(r: &Req, res: Res) -> Result<(FieldSelector, LabelSelector), ApiError> {
    let f = FieldSelector::parse(r.q("fieldSelector").unwrap_or(""), res)
        .map_err(ApiError::bad_request)?;
    let l =
        LabelSelector::parse(r.q("labelSelector").unwrap_or("")).map_err(ApiError::bad_request)?;
    Ok((f, l))
}

fn list(shared: &Shared, r: &Req, t: &Target) -> Result<Response<RespBody>, ApiError> {
    use base64::Engine as _;
    let (fsel, lsel) = selectors(r, t.res)?;
    let st = lock(&shared.store);
    let current = st.current_rv();
    if let (Some(rv), Some("Exact")) = (r.q("resourceVersion"), r.q("resourceVersionMatch")) {
        let rv: u64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
        if rv < st.compacted_rv() {
            return Err(ApiError::expired(
                "The resourceVersion for the provided list is too old.",
            ));
        }
    }
    let ns_filter = t
        .namespace
        .as_deref()
        .or_else(|| fsel.required("metadata.namespace"));
    let all = st.list(t.res, ns_filter);
    drop(st);
    let start_after = match r.q("continue").filter(|c| !c.is_empty()) {
        Some(c) => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(c)
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            let v: Value = serde_json::from_slice(&raw)
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            Some(v["start"].as_str().unwrap_or("").to_string())
        }
        None => None,
    };
    let limit: usize = r.q("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let key_of = |o: &Value| format!("{}/{}", meta_str(o, "namespace"), meta_str(o, "name"));
    let mut items = Vec::new();
    let mut next_key = None;
    let mut remaining = 0u64;
    for o in &all {
        if let Some(s) = &start_after
            && key_of(o) <= *s
        {
            continue;
        }
        if !fsel.matches(o) || !lsel.matches(o) {
            continue;
        }
        if limit > 0 && items.len() >= limit {
            if next_key.is_none() {
                next_key = items.last().map(|x: &Value| key_of(x));
            }
            remaining += 1;
            continue;
        }
        let mut v = resources::to_version(t.res, o, &t.version, mode(shared));
        if let Value::Object(m) = &mut v {
            m.remove("apiVersion");
            m.remove("kind");
        }
        items.push(v);
    }
    let mut meta = json!({"resourceVersion": current.to_string()});
    if let Some(k) = next_key {
        let token = json!({"v": "meta.k8s.io/v1", "rv": current, "start": k});
        meta["continue"] =
            json!(base64::engine::general_purpose::STANDARD.encode(token.to_string()));
        // kube-apiserver only counts the rest when no selector filters it.
        if r.q("fieldSelector").unwrap_or("").is_empty()
            && r.q("labelSelector").unwrap_or("").is_empty()
        {
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    Ok(json_response(
        200,
        &json!({
            "kind": format!("{}List", t.res.kind()),
            "apiVersion": t.res.api_version(&t.version),
            "metadata": meta,
            "items": items,
        }),
    ))
}

fn line(typ: &str, obj: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": typ, "object": obj})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn watch(shared: &Arc<Shared>, r: &Req, t: &Target) -> Result<Response<RespBody>, ApiError> {
    let (fsel, lsel) = selectors(r, t.res)?;
    let version = t.version.clone();
    let res = t.res;
    let md = mode(shared);
    let ns = t.namespace.clone();
    let rv_param = r.q("resourceVersion").unwrap_or("").to_string();
    let send_initial = r.flag("sendInitialEvents");
    let bookmarks = r.flag("allowWatchBookmarks");
    let timeout = r
        .q("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let matches = move |e_res: Res, obj: &Value| {
        e_res == res
            && ns
                .as_deref()
                .is_none_or(|n| meta_str(obj, "namespace") == n)
            && fsel.matches(obj)
            && lsel.matches(obj)
    };
    let render = move |obj: &Value| resources::to_version(res, obj, &version, md);
    let kind_av = (t.res.kind().to_string(), t.res.api_version(&t.version));

    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let resp = {
        let mut resp = Response::new(BoxBody::new(ChannelBody { rx }));
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        resp
    };
    let mut kill = shared.kill_watches.subscribe();
    kill.mark_unchanged();

    let st = lock(&shared.store);
    let mut initial: Vec<Arc<Value>> = Vec::new();
    let mut backlog: Vec<Arc<Event>> = Vec::new();
    let start_rv;
    if rv_param.is_empty() || rv_param == "0" || send_initial {
        initial = st
            .list(t.res, t.namespace.as_deref())
            .into_iter()
            .filter(|o| matches(res, o))
            .collect();
        start_rv = st.current_rv();
    } else {
        let Ok(rv) = rv_param.parse::<u64>() else {
            return Err(ApiError::bad_request(format!(
                "invalid resource version: {rv_param}"
            )));
        };
        match st.events_since(rv) {
            Some(evs) => backlog = evs,
            None => {
                let e = ApiError::expired(format!(
                    "too old resource version: {rv} ({})",
                    st.compacted_rv()
                ));
                let _ = tx.try_send(line("ERROR", &e.to_status()));
                return Ok(resp);
            }
        }
        start_rv = rv.max(backlog.last().map_or(rv, |e| e.rv));
    }
    let mut events = st.subscribe();
    drop(st);
    shared.count(|c| c.watches_opened += 1);
    let bookmark_every = shared.config.bookmark_interval;
    let shared_weak = Arc::downgrade(shared);

    tokio::spawn(async move {
        let mut last = start_rv;
        for o in &initial {
            if tx.send(line("ADDED", &render(o))).await.is_err() {
                return;
            }
        }
        let bookmark = |rv: u64, initial_end: bool| {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if initial_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            line(
                "BOOKMARK",
                &json!({"kind": kind_av.0, "apiVersion": kind_av.1, "metadata": meta}),
            )
        };
        if send_initial && bookmarks && tx.send(bookmark(last, true)).await.is_err() {
            return;
        }
        for e in &backlog {
            if matches(e.res, &e.object)
                && tx
                    .send(line(e.typ.as_str(), &render(&e.object)))
                    .await
                    .is_err()
            {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval(bookmark_every.max(Duration::from_millis(10)));
        tick.tick().await;
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Ok(e) => {
                        if e.rv <= last {
                            continue;
                        }
                        last = e.rv;
                        if matches(e.res, &e.object)
                            && tx.send(line(e.typ.as_str(), &render(&e.object))).await.is_err()
                        {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = kill.changed() => return,
                () = tokio::time::sleep_until(deadline) => return,
                _ = tick.tick(), if bookmarks => {
                    if tx.send(bookmark(last, false)).await.is_err() {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
            if shared_weak.strong_count() == 0 {
                return;
            }
        }
    });
    Ok(resp)
}

fn parse_body(r: &Req) -> Result<Value, ApiError> {
    let ct = r.content_type.split(';').next().unwrap_or("").trim();
    if ct.contains("yaml") {
        return patch::parse_apply_yaml(&r.body).map_err(ApiError::bad_request);
    }
    serde_json::from_slice(&r.body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })
}

fn check_api_version(body: &Value, res: Res, version: &str) -> Result<(), ApiError> {
    let want = res.api_version(version);
    if let Some(av) = body.get("apiVersion").and_then(Value::as_str)
        && av != want
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({want})"
        )));
    }
    if let Some(k) = body.get("kind").and_then(Value::as_str)
        && k != res.kind()
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            res.kind()
        )));
    }
    Ok(())
}

fn decode_err(res: Res, version: &str, e: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{} in version \"{version}\" cannot be handled as a {}: {e}",
        res.kind(),
        res.kind()
    ))
}

fn generate_suffix() -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut b = [0u8; 5];
    let _ = aws_lc_rs::rand::fill(&mut b);
    b.iter()
        .map(|x| ALPHA[*x as usize % ALPHA.len()] as char)
        .collect()
}

/// A free name for `generateName`: kube-apiserver retries a generated name that collides
/// (RetryGenerateName, GA since 1.32), so a random clash never fails a create.
fn generated_name(shared: &Shared, res: Res, ns: &str, prefix: &str) -> String {
    let st = lock(&shared.store);
    let mut name = format!("{prefix}{}", generate_suffix());
    for _ in 0..8 {
        if st.get(res, ns, &name).is_none() {
            break;
        }
        name = format!("{prefix}{}", generate_suffix());
    }
    name
}

/// Build the server-side metadata of a new object.
fn new_metadata(
    shared: &Shared,
    body_meta: Option<&Value>,
    ns: &str,
    name: &str,
) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("name".into(), json!(name));
    if !ns.is_empty() {
        m.insert("namespace".into(), json!(ns));
    }
    m.insert("uid".into(), json!(new_uid()));
    m.insert(
        "creationTimestamp".into(),
        json!(pcr::fmt_time(shared.now())),
    );
    if let Some(Value::Object(bm)) = body_meta {
        for k in [
            "labels",
            "annotations",
            "ownerReferences",
            "finalizers",
            "generateName",
        ] {
            if let Some(v) = bm.get(k).filter(|v| !v.is_null()) {
                m.insert(k.into(), v.clone());
            }
        }
    }
    m
}

fn validate_meta_labels(meta: &Map<String, Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(Value::Object(labels)) = meta.get("labels") {
        for (k, v) in labels {
            for m in super::names::is_qualified_name(k) {
                errs.push(FieldError::invalid_str("metadata.labels", k, m));
            }
            let vs = v.as_str().unwrap_or("");
            for m in super::names::is_valid_label_value(vs) {
                errs.push(FieldError::invalid_str("metadata.labels", vs, m));
            }
        }
    }
    errs
}

fn ensure_namespace(shared: &Shared, ns: &str) -> Result<(), ApiError> {
    if ns.is_empty() {
        return Ok(());
    }
    let exists = lock(&shared.store).get(Res::Namespace, "", ns).is_some();
    if exists {
        return Ok(());
    }
    if shared.config.auto_create_namespaces {
        let meta =
            json!({"name": ns, "uid": new_uid(), "creationTimestamp": pcr::fmt_time(shared.now())});
        lock(&shared.store).put(Res::Namespace, "", ns, json!({"metadata": meta, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}));
        return Ok(());
    }
    Err(ApiError::not_found("namespaces", "", ns))
}

fn create(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
) -> Result<Response<RespBody>, ApiError> {
    let body = parse_body(r)?;
    if !body.is_object() {
        return Err(decode_err(t.res, &t.version, "expected an object"));
    }
    check_api_version(&body, t.res, &t.version)?;
    let ns = t.namespace.clone().unwrap_or_default();
    let body_ns = meta_str(&body, "namespace");
    if !body_ns.is_empty() && body_ns != ns && t.res.namespaced() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let mut name = meta_str(&body, "name").to_string();
    let generate = meta_str(&body, "generateName").to_string();
    match t.res {
        Res::Pcr => create_pcr(shared, r, user, t, &body, &ns, name, &generate),
        Res::Ctb => create_ctb(shared, r, user, t, &body, name),
        _ => {
            if name.is_empty() && generate.is_empty() {
                return Err(ApiError::invalid(
                    t.res.kind(),
                    t.res.group(),
                    "",
                    vec![FieldError::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
            if name.is_empty() {
                name = generated_name(shared, t.res, &ns, &generate);
            }
            ensure_namespace(shared, &ns)?;
            let mut meta = new_metadata(shared, body.get("metadata"), &ns, &name);
            let lerrs = validate_meta_labels(&meta);
            if !lerrs.is_empty() {
                return Err(ApiError::invalid(t.res.kind(), t.res.group(), &name, lerrs));
            }
            let mut obj = body.clone();
            if let Value::Object(m) = &mut obj {
                m.remove("apiVersion");
                m.remove("kind");
                if t.res == Res::Lease || t.res == Res::Namespace {
                    // nothing special
                }
                let set = managed::changed_fields(None, &Value::Object(m.clone()));
                meta.insert("managedFields".into(), json!([]));
                m.insert("metadata".into(), Value::Object(meta));
                managed::record(
                    &mut obj,
                    &r.manager(),
                    "Update",
                    &t.res.api_version(&t.version),
                    None,
                    &set,
                    &pcr::fmt_time(shared.now()),
                    false,
                );
            }
            if t.res == Res::Namespace {
                obj["status"] = json!({"phase": "Active"});
            }
            store_new(shared, r, t, &ns, &name, obj)
        }
    }
}

fn store_new(
    shared: &Shared,
    r: &Req,
    t: &Target,
    ns: &str,
    name: &str,
    obj: Value,
) -> Result<Response<RespBody>, ApiError> {
    let mut st = lock(&shared.store);
    if st.get(t.res, ns, name).is_some() {
        return Err(ApiError::already_exists(
            t.res.plural(),
            t.res.group(),
            name,
        ));
    }
    let stored = if r.dry_run() {
        Arc::new(obj)
    } else {
        st.put(t.res, ns, name, obj)
    };
    drop(st);
    Ok(json_response(
        201,
        &resources::to_version(t.res, &stored, &t.version, mode(shared)),
    ))
}

fn key_rules(mode: ApiMode, version: &str) -> KeyRules {
    match (mode, version) {
        (_, "v1") => KeyRules::StubOnly,
        (ApiMode::V1Beta1Legacy, _) => KeyRules::LegacyOnly,
        _ => KeyRules::StubOrLegacy,
    }
}

#[allow(clippy::too_many_arguments)]
fn create_pcr(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
    body: &Value,
    ns: &str,
    mut name: String,
    generate: &str,
) -> Result<Response<RespBody>, ApiError> {
    let md = mode(shared);
    let mut spec_json = body.get("spec").cloned().unwrap_or(Value::Null);
    resources::pcr_spec_from_version(&mut spec_json, &t.version, md, None);
    let mut spec =
        PcrSpec::from_json(Some(&spec_json)).map_err(|e| decode_err(Res::Pcr, &t.version, &e))?;
    if spec.max_expiration_seconds.is_none() {
        spec.max_expiration_seconds = Some(pcr::DEFAULT_MAX_EXPIRATION);
    }
    if name.is_empty() && !generate.is_empty() {
        name = generated_name(shared, Res::Pcr, ns, generate);
    }
    // Mutating admission: NodeRestriction.
    if let Some(node) = user.node_name() {
        node_restriction(shared, user, node, ns, &name, &spec, md)?;
    }
    ensure_namespace(shared, ns)?;
    let errs = pcr::validate_create(&name, generate, &spec, key_rules(md, &t.version));
    let mut meta = new_metadata(shared, body.get("metadata"), ns, &name);
    let mut errs = errs;
    errs.extend(validate_meta_labels(&meta));
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "PodCertificateRequest",
            Res::Pcr.group(),
            &name,
            errs,
        ));
    }
    meta.insert("managedFields".into(), json!([]));
    let mut obj = json!({"metadata": Value::Object(meta), "spec": spec.to_json(), "status": {}});
    let set = managed::changed_fields(None, &json!({"spec": spec_json_for_fields(&spec)}));
    managed::record(
        &mut obj,
        &r.manager(),
        "Update",
        &Res::Pcr.api_version(&t.version),
        None,
        &set,
        &pcr::fmt_time(shared.now()),
        false,
    );
    let resp = store_new(shared, r, t, ns, &name, obj)?;
    shared.count(|c| c.pcr_created += 1);
    Ok(resp)
}

fn spec_json_for_fields(spec: &PcrSpec) -> Value {
    let mut v = spec.to_json();
    if let Value::Object(m) = &mut v {
        m.retain(|_, x| !x.is_null());
    }
    v
}

/// NodeRestriction admission for PCR creates by nodes (rule 9).
fn node_restriction(
    shared: &Shared,
    user: &UserInfo,
    node: &str,
    ns: &str,
    name: &str,
    spec: &PcrSpec,
    md: ApiMode,
) -> Result<(), ApiError> {
    let forbid = |msg: String| ApiError::forbidden(Res::Pcr.plural(), Res::Pcr.group(), name, &msg);
    let pod_ref = format!("{ns}/{}", spec.pod_name);
    let q = super::errors::go_quote;
    if spec.node_name != node {
        return Err(forbid(format!(
            "PodCertificateRequest.Spec.NodeName={}, which is not the requesting node {}",
            q(&spec.node_name),
            q(node)
        )));
    }
    let st = lock(&shared.store);
    let Some(node_obj) = st.get(Res::Node, "", &spec.node_name) else {
        return Err(ApiError::plain(format!(
            "while retrieving node {} named in the PodCertificateRequest: nodes {} not found",
            q(&spec.node_name),
            q(&spec.node_name)
        )));
    };
    if meta_str(&node_obj, "uid") != spec.node_uid {
        return Err(ApiError::plain(format!(
            "PodCertificateRequest for pod {} names node UID {}, inconsistent with the running node ({})",
            q(&pod_ref),
            q(&spec.node_uid),
            q(meta_str(&node_obj, "uid"))
        )));
    }
    let Some(pod) = st.get(Res::Pod, ns, &spec.pod_name) else {
        return Err(ApiError::plain(format!(
            "while retrieving pod {} named in the PodCertificateRequest: pods {} not found",
            q(&pod_ref),
            q(&spec.pod_name)
        )));
    };
    if meta_str(&pod, "uid") != spec.pod_uid {
        return Err(ApiError::plain(format!(
            "PodCertificateRequest for pod {} contains pod UID ({}) which differs from running pod {}",
            q(&pod_ref),
            q(&spec.pod_uid),
            q(meta_str(&pod, "uid"))
        )));
    }
    let pod_node = pod["spec"]["nodeName"].as_str().unwrap_or("");
    if pod_node != node {
        return Err(forbid(format!(
            "pod {} is not running on node {}",
            q(&pod_ref),
            q(node)
        )));
    }
    if pod["metadata"]["annotations"]
        .get("kubernetes.io/config.mirror")
        .is_some()
    {
        return Err(forbid(format!("pod {} is a mirror pod", q(&pod_ref))));
    }
    let pod_sa = pod["spec"]["serviceAccountName"].as_str().unwrap_or("");
    if spec.service_account_name != pod_sa {
        return Err(forbid(format!(
            "PodCertificateRequest for pod {} contains serviceAccountName ({}) that differs from running pod ({})",
            q(&pod_ref),
            q(&spec.service_account_name),
            q(pod_sa)
        )));
    }
    let sa_ref = format!("{ns}/{}", spec.service_account_name);
    let Some(sa) = st.get(Res::ServiceAccount, ns, &spec.service_account_name) else {
        return Err(ApiError::plain(format!(
            "while retrieving service account {} named in the PodCertificateRequest: serviceaccounts {} not found",
            q(&sa_ref),
            q(&spec.service_account_name)
        )));
    };
    if meta_str(&sa, "uid") != spec.service_account_uid {
        return Err(ApiError::plain(format!(
            "PodCertificateRequest for pod {} names service account UID {}, which differs from the running service account ({})",
            q(&pod_ref),
            q(&spec.service_account_uid),
            q(meta_str(&sa, "uid"))
        )));
    }
    drop(st);
    // 1.37 (PR #140006): the pod must mount a podCertificate projection for
    // the signer, or the node needs `request-podcertificate-signer`.
    if matches!(md, ApiMode::V1Only | ApiMode::V1AndV1Beta1) {
        let mounts = pod["spec"]["volumes"].as_array().is_some_and(|vols| {
            vols.iter().any(|v| {
                v["projected"]["sources"].as_array().is_some_and(|srcs| {
                    srcs.iter()
                        .any(|s| s["podCertificate"]["signerName"] == spec.signer_name.as_str())
                })
            })
        });
        if !mounts
            && !read(&shared.auth).authorized_for_signer(
                user,
                "request-podcertificate-signer",
                &spec.signer_name,
            )
        {
            return Err(forbid(format!(
                "pod {} does not have a podCertificate projected volume source for signer {}",
                q(&pod_ref),
                q(&spec.signer_name)
            )));
        }
    }
    Ok(())
}

fn ctb_spec(v: &Value, version: &str) -> Result<(String, String), ApiError> {
    let s = v.get("spec").cloned().unwrap_or(Value::Null);
    let get = |k: &str| -> Result<String, ApiError> {
        match s.get(k) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(x)) => Ok(x.clone()),
            Some(_) => Err(decode_err(
                Res::Ctb,
                version,
                &format!(
                    "json: cannot unmarshal into Go struct field ClusterTrustBundleSpec.spec.{k} of type string"
                ),
            )),
        }
    };
    Ok((get("signerName")?, get("trustBundle")?))
}

fn ctb_spec_json(signer: &str, bundle: &str) -> Value {
    let mut m = Map::new();
    if !signer.is_empty() {
        m.insert("signerName".into(), json!(signer));
    }
    m.insert("trustBundle".into(), json!(bundle));
    Value::Object(m)
}

fn validate_ctb(
    name: &str,
    meta: &Value,
    signer: &str,
    bundle: &str,
    parse_bundle: bool,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        for m in super::names::validate_ctb_name(signer, name) {
            errs.push(FieldError::invalid_str("metadata.name", name, m));
        }
    }
    if !meta_str(meta, "namespace").is_empty() {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    if let Some(Value::Object(m)) = meta.get("metadata") {
        errs.extend(validate_meta_labels(m));
    }
    if !signer.is_empty() {
        errs.extend(super::names::validate_signer_name(
            "spec.signerName",
            signer,
        ));
    }
    if parse_bundle {
        errs.extend(pcr::validate_trust_bundle(bundle));
    }
    errs
}

fn attest(shared: &Shared, user: &UserInfo, name: &str, signer: &str) -> Result<(), ApiError> {
    if signer.is_empty() || read(&shared.auth).authorized_for_signer(user, "attest", signer) {
        return Ok(());
    }
    Err(ApiError::forbidden(
        Res::Ctb.plural(),
        Res::Ctb.group(),
        name,
        &format!(
            "user not permitted to attest for signerName {}",
            super::errors::go_quote(signer)
        ),
    ))
}

fn create_ctb(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
    body: &Value,
    mut name: String,
) -> Result<Response<RespBody>, ApiError> {
    let (signer, bundle) = ctb_spec(body, &t.version)?;
    let generate = meta_str(body, "generateName").to_string();
    if name.is_empty() && !generate.is_empty() {
        name = generated_name(shared, Res::Ctb, "", &generate);
    }
    let errs = validate_ctb(&name, body, &signer, &bundle, true);
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "ClusterTrustBundle",
            Res::Ctb.group(),
            &name,
            errs,
        ));
    }
    attest(shared, user, &name, &signer)?;
    let mut meta = new_metadata(shared, body.get("metadata"), "", &name);
    meta.insert("managedFields".into(), json!([]));
    let spec = ctb_spec_json(&signer, &bundle);
    let mut obj = json!({"metadata": Value::Object(meta), "spec": spec});
    let set = managed::changed_fields(None, &json!({"spec": obj["spec"].clone()}));
    managed::record(
        &mut obj,
        &r.manager(),
        "Update",
        &Res::Ctb.api_version(&t.version),
        None,
        &set,
        &pcr::fmt_time(shared.now()),
        false,
    );
    let resp = store_new(shared, r, t, "", &name, obj)?;
    shared.count(|c| c.ctb_writes_accepted += 1);
    Ok(resp)
}

/// How an update computes the new object.
enum Op {
    Put(Value),
    Merge(Value),
    Strategic(Value),
    JsonPatch(Value),
    Apply(Value),
}

fn parse_op(r: &Req, verb: &str) -> Result<Op, ApiError> {
    let ct = r
        .content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if verb == "update" {
        return Ok(Op::Put(parse_body(r)?));
    }
    let json_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(&r.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
    };
    match ct.as_str() {
        "application/merge-patch+json" => Ok(Op::Merge(json_body()?)),
        "application/strategic-merge-patch+json" => Ok(Op::Strategic(json_body()?)),
        "application/json-patch+json" => Ok(Op::JsonPatch(json_body()?)),
        "application/apply-patch+yaml" | "application/apply-patch+json" => {
            if r.q("fieldManager").unwrap_or("").is_empty() {
                return Err(ApiError::invalid(
                    "PatchOptions",
                    "meta.k8s.io",
                    "",
                    vec![FieldError::required(
                        "fieldManager",
                        "is required for apply patch",
                    )],
                ));
            }
            Ok(Op::Apply(patch::parse_apply_yaml(&r.body).map_err(
                |e| ApiError::bad_request(format!("error decoding YAML: {e}")),
            )?))
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn strip_meta_server_fields(v: &mut Value) {
    if let Some(Value::Object(m)) = v.get_mut("metadata") {
        m.remove("managedFields");
    }
}

fn update(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
    verb: &str,
) -> Result<Response<RespBody>, ApiError> {
    let op = parse_op(r, verb)?;
    let md = mode(shared);
    let ns = t.namespace.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let res = t.res;
    let is_status = t.sub.as_deref() == Some("status");
    let manager = r.manager();
    let now = shared.now();
    let now_s = pcr::fmt_time(now);

    let mut st = lock(&shared.store);
    let Some(old) = st.get(res, &ns, &name) else {
        drop(st);
        if let (Op::Apply(cfg), false) = (&op, is_status) {
            // Server-side apply creates a missing object.
            return apply_create(shared, r, user, t, cfg.clone());
        }
        return Err(ApiError::not_found(res.plural(), res.group(), &name));
    };
    let old_v = resources::to_version(res, &old, &t.version, md);
    let mut apply_set: Option<Map<String, Value>> = None;
    let mut new_v = match &op {
        Op::Put(body) => {
            check_api_version(body, res, &t.version)?;
            let body_name = meta_str(body, "name");
            if body_name != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
            let brv = meta_str(body, "resourceVersion");
            if brv.is_empty() {
                return Err(ApiError::invalid(
                    res.plural(),
                    res.group(),
                    &name,
                    vec![FieldError::invalid_raw(
                        "metadata.resourceVersion",
                        "0",
                        "must be specified for an update",
                    )],
                ));
            }
            body.clone()
        }
        Op::Merge(p) => {
            let mut v = old_v.clone();
            patch::merge_patch(&mut v, p);
            v
        }
        Op::Strategic(p) => {
            let mut v = old_v.clone();
            patch::strategic_merge(&mut v, p);
            v
        }
        Op::JsonPatch(p) => {
            let mut v = old_v.clone();
            patch::json_patch(&mut v, p).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
            v
        }
        Op::Apply(cfg) => {
            check_api_version(cfg, res, &t.version)?;
            let mut v = old_v.clone();
            let mut c = cfg.clone();
            if let Value::Object(m) = &mut c {
                m.remove("apiVersion");
                m.remove("kind");
            }
            patch::strategic_merge(&mut v, &c);
            let mut set = managed::changed_fields(None, &c);
            if is_status {
                set.retain(|k, _| k == "f:status");
            }
            apply_set = Some(set);
            v
        }
    };
    // Optimistic concurrency.
    let new_rv = meta_str(&new_v, "resourceVersion").to_string();
    if !new_rv.is_empty() && new_rv != meta_str(&old, "resourceVersion") {
        return Err(ApiError::conflict(res.plural(), res.group(), &name));
    }
    if !new_v.is_object() {
        return Err(ApiError::bad_request("the object must be a JSON object"));
    }
    // Convert to hub form.
    if let Value::Object(m) = &mut new_v {
        m.remove("apiVersion");
        m.remove("kind");
        if res == Res::Pcr
            && let Some(spec) = m.get_mut("spec")
        {
            resources::pcr_spec_from_version(spec, &t.version, md, old.get("spec"));
        }
    }
    // Managed fields (computed before the strategy resets anything).
    let mut old_cmp = (*old).clone();
    strip_meta_server_fields(&mut old_cmp);
    let mut new_cmp = new_v.clone();
    strip_meta_server_fields(&mut new_cmp);
    let (set, operation) = match apply_set {
        Some(s) => (s, "Apply"),
        None => {
            let mut s = managed::changed_fields(Some(&old_cmp), &new_cmp);
            if is_status {
                s.retain(|k, _| k == "f:status");
            }
            (s, "Update")
        }
    };
    // Server-managed metadata is kept from the stored object.
    let mut new_obj = new_v;
    {
        let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let new_meta = new_obj
            .get("metadata")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let mut meta = if is_status {
            old_meta.clone()
        } else {
            new_meta
        };
        if let Value::Object(m) = &mut meta {
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "resourceVersion",
                "generation",
                "managedFields",
                "deletionTimestamp",
            ] {
                match old_meta.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
        }
        new_obj["metadata"] = meta;
    }
    let mf_changed = managed::record(
        &mut new_obj,
        &manager,
        operation,
        &res.api_version(&t.version),
        t.sub.as_deref(),
        &set,
        &now_s,
        operation == "Apply",
    );
    let _ = mf_changed;

    // Strategy.
    let mut status_outcome = None;
    match (res, is_status) {
        (Res::Pcr, true) => {
            new_obj["spec"] = old.get("spec").cloned().unwrap_or(Value::Null);
            let spec = PcrSpec::from_json(old.get("spec")).map_err(ApiError::internal)?;
            let old_status = PcrStatus::from_json(old.get("status")).map_err(ApiError::internal)?;
            let new_status = PcrStatus::from_json(new_obj.get("status"))
                .map_err(|e| decode_err(Res::Pcr, &t.version, &e))?;
            let errs = pcr::validate_status_update(&new_status, &old_status, &spec, now);
            if !errs.is_empty() {
                return Err(ApiError::invalid(
                    "PodCertificateRequest",
                    res.group(),
                    &name,
                    errs,
                ));
            }
            if new_status != old_status {
                if !read(&shared.auth).authorized_for_signer(user, "sign", &spec.signer_name) {
                    return Err(ApiError::invalid(
                        "PodCertificateRequest",
                        res.group(),
                        &name,
                        vec![FieldError::forbidden(
                            "spec.signerName",
                            format!(
                                "User {} is not permitted to \"sign\" for signer {}",
                                super::errors::go_quote(&user.name),
                                super::errors::go_quote(&spec.signer_name)
                            ),
                        )],
                    ));
                }
                status_outcome = Some(new_status.clone());
                new_obj["status"] = new_status.to_json();
            } else {
                new_obj["status"] = old.get("status").cloned().unwrap_or_else(|| json!({}));
            }
        }
        (Res::Pcr, false) => {
            if user.node_name().is_some() {
                return Err(ApiError::forbidden(
                    res.plural(),
                    res.group(),
                    &name,
                    "unexpected operation UPDATE",
                ));
            }
            new_obj["status"] = old.get("status").cloned().unwrap_or_else(|| json!({}));
            let old_spec = PcrSpec::from_json(old.get("spec")).map_err(ApiError::internal)?;
            let new_spec = PcrSpec::from_json(new_obj.get("spec"))
                .map_err(|e| decode_err(Res::Pcr, &t.version, &e))?;
            let mut errs = Vec::new();
            if let Some(Value::Object(m)) = new_obj.get("metadata") {
                errs.extend(validate_meta_labels(m));
            }
            errs.extend(pcr::validate_update(&new_spec, &old_spec));
            if !errs.is_empty() {
                return Err(ApiError::invalid(
                    "PodCertificateRequest",
                    res.group(),
                    &name,
                    errs,
                ));
            }
            new_obj["spec"] = old.get("spec").cloned().unwrap_or(Value::Null);
        }
        (Res::Ctb, _) => {
            let (signer, bundle) = ctb_spec(&new_obj, &t.version)?;
            let (old_signer, old_bundle) = ctb_spec(&old, &t.version)?;
            let mut errs = validate_ctb(&name, &new_obj, &signer, &bundle, bundle != old_bundle);
            if signer != old_signer {
                errs.push(FieldError::invalid_str(
                    "spec.signerName",
                    &signer,
                    "field is immutable",
                ));
            }
            if !errs.is_empty() {
                return Err(ApiError::invalid(
                    "ClusterTrustBundle",
                    res.group(),
                    &name,
                    errs,
                ));
            }
            new_obj["spec"] = ctb_spec_json(&signer, &bundle);
            if !only_gc_fields_changed(&old, &new_obj) {
                attest(shared, user, &name, &signer)?;
            }
        }
        _ => {
            if let Some(Value::Object(m)) = new_obj.get("metadata") {
                let errs = validate_meta_labels(m);
                if !errs.is_empty() {
                    return Err(ApiError::invalid(res.kind(), res.group(), &name, errs));
                }
            }
            if is_status {
                let status = new_obj.get("status").cloned();
                new_obj = (*old).clone();
                if let Some(s) = status {
                    new_obj["status"] = s;
                }
            } else if res.has_status() {
                new_obj["status"] = old.get("status").cloned().unwrap_or(Value::Null);
            }
        }
    }

    // No-op?
    let mut old_nometa = (*old).clone();
    let mut new_nometa = new_obj.clone();
    for v in [&mut old_nometa, &mut new_nometa] {
        if let Some(Value::Object(m)) = v.get_mut("metadata") {
            m.remove("resourceVersion");
        }
    }
    let stored = if old_nometa == new_nometa || r.dry_run() {
        if res == Res::Pcr && is_status {
            shared.count(|c| c.status_writes_noop += 1);
        }
        if r.dry_run() {
            Arc::new(new_obj)
        } else {
            old.clone()
        }
    } else {
        st.put(res, &ns, &name, new_obj)
    };
    drop(st);
    if let Some(s) = status_outcome {
        shared.count(|c| {
            c.status_writes_accepted += 1;
            if s.is_issued() {
                c.issued += 1;
            } else if s.is_denied() {
                c.denied += 1;
            } else if s.is_failed() {
                c.failed += 1;
            }
        });
    }
    if res == Res::Ctb {
        shared.count(|c| c.ctb_writes_accepted += 1);
    }
    Ok(json_response(
        200,
        &resources::to_version(res, &stored, &t.version, md),
    ))
}

fn only_gc_fields_changed(old: &Value, new: &Value) -> bool {
    let norm = |v: &Value| {
        let mut v = v.clone();
        if let Some(Value::Object(m)) = v.get_mut("metadata") {
            for k in [
                "ownerReferences",
                "finalizers",
                "managedFields",
                "resourceVersion",
            ] {
                m.remove(k);
            }
        }
        v
    };
    norm(old) == norm(new)
}

fn apply_create(
    shared: &Arc<Shared>,
    r: &Req,
    user: &UserInfo,
    t: &Target,
    cfg: Value,
) -> Result<Response<RespBody>, ApiError> {
    check_api_version(&cfg, t.res, &t.version)?;
    if !cfg.is_object() {
        return Err(ApiError::bad_request(
            "the apply configuration must be an object",
        ));
    }
    let name = t.name.clone().unwrap_or_default();
    let mut body = cfg;
    if let Some(Value::Object(m)) = body.get_mut("metadata") {
        m.insert("name".into(), json!(name));
    }
    let ns = t.namespace.clone().unwrap_or_default();
    match t.res {
        Res::Pcr => create_pcr(shared, r, user, t, &body, &ns, name, ""),
        Res::Ctb => create_ctb(shared, r, user, t, &body, name),
        _ => {
            ensure_namespace(shared, &ns)?;
            let mut meta = new_metadata(shared, body.get("metadata"), &ns, &name);
            meta.insert("managedFields".into(), json!([]));
            let mut obj = body.clone();
            if let Value::Object(m) = &mut obj {
                m.remove("apiVersion");
                m.remove("kind");
            }
            let set = managed::changed_fields(None, &obj);
            obj["metadata"] = Value::Object(meta);
            managed::record(
                &mut obj,
                &r.manager(),
                "Apply",
                &t.res.api_version(&t.version),
                None,
                &set,
                &pcr::fmt_time(shared.now()),
                true,
            );
            store_new(shared, r, t, &ns, &name, obj)
        }
    }
}

fn delete(shared: &Arc<Shared>, r: &Req, t: &Target) -> Result<Response<RespBody>, ApiError> {
    let ns = t.namespace.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let opts: Value = if r.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&r.body).unwrap_or(Value::Null)
    };
    let mut st = lock(&shared.store);
    let Some(old) = st.get(t.res, &ns, &name) else {
        return Err(ApiError::not_found(t.res.plural(), t.res.group(), &name));
    };
    let pre = &opts["preconditions"];
    if let Some(uid) = pre["uid"].as_str()
        && uid != meta_str(&old, "uid")
    {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {}: Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                super::errors::qualified(t.res.plural(), t.res.group()),
                super::errors::go_quote(&name),
                meta_str(&old, "uid")
            ),
        ));
    }
    if let Some(rv) = pre["resourceVersion"].as_str()
        && rv != meta_str(&old, "resourceVersion")
    {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {}: Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in meta: {}",
                super::errors::qualified(t.res.plural(), t.res.group()),
                super::errors::go_quote(&name),
                meta_str(&old, "resourceVersion")
            ),
        ));
    }
    let uid = meta_str(&old, "uid").to_string();
    if !r.dry_run() {
        st.delete(t.res, &ns, &name);
    }
    drop(st);
    Ok(json_response(
        200,
        &json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "group": t.res.group(), "kind": t.res.plural(), "uid": uid},
        }),
    ))
}

fn delete_collection(
    shared: &Arc<Shared>,
    r: &Req,
    t: &Target,
) -> Result<Response<RespBody>, ApiError> {
    let (fsel, lsel) = selectors(r, t.res)?;
    let mut st = lock(&shared.store);
    let victims: Vec<(String, String)> = st
        .list(t.res, t.namespace.as_deref())
        .iter()
        .filter(|o| fsel.matches(o) && lsel.matches(o))
        .map(|o| {
            (
                meta_str(o, "namespace").to_string(),
                meta_str(o, "name").to_string(),
            )
        })
        .collect();
    let mut items = Vec::new();
    for (ns, name) in victims {
        if let Some(o) = st.delete(t.res, &ns, &name) {
            items.push(resources::to_version(t.res, &o, &t.version, mode(shared)));
        }
    }
    let rv = st.current_rv();
    drop(st);
    Ok(json_response(
        200,
        &json!({"kind": format!("{}List", t.res.kind()), "apiVersion": t.res.api_version(&t.version), "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    ))
}

fn token_review(shared: &Shared, r: &Req, user: &UserInfo) -> Result<Response<RespBody>, ApiError> {
    if r.method != Method::POST {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    authorize(
        shared,
        user,
        Attrs {
            verb: "create",
            group: "authentication.k8s.io",
            resource: "tokenreviews",
            subresource: "",
            namespace: "",
            name: "",
        },
    )?;
    let body = parse_body(r)?;
    let token = body["spec"]["token"].as_str().unwrap_or("").to_string();
    let req_aud: Vec<String> = body["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let wanted = if req_aud.is_empty() {
        shared.config.api_audiences.clone()
    } else {
        req_aud.clone()
    };
    shared.count(|c| c.token_reviews += 1);
    let a = read(&shared.auth);
    let status = if let Some((_, u)) = a.tokens.get(&token) {
        json!({"authenticated": true, "user": u.to_json(), "audiences": wanted})
    } else if let Some(t) = a.sa_tokens.get(&token) {
        let now = shared.now();
        let inter: Vec<String> = wanted
            .iter()
            .filter(|w| t.audiences.contains(w))
            .cloned()
            .collect();
        if now >= t.expires {
            json!({"authenticated": false, "user": {}, "error": "[invalid bearer token, service account token has expired]"})
        } else if inter.is_empty() {
            json!({"authenticated": false, "user": {}, "error": "[invalid bearer token, token audiences ... is invalid for the target audiences]"})
        } else {
            json!({"authenticated": true, "user": t.user().to_json(), "audiences": inter})
        }
    } else {
        json!({"authenticated": false, "user": {}, "error": "[invalid bearer token, token lookup failed]"})
    };
    let mut spec = json!({"token": token});
    if !req_aud.is_empty() {
        spec["audiences"] = json!(req_aud);
    }
    Ok(json_response(
        201,
        &json!({
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": status,
        }),
    ))
}

#[allow(dead_code)]
fn event_type_name(t: EventType) -> &'static str {
    t.as_str()
}

#[allow(dead_code)]
fn rv_of(v: &Value) -> u64 {
    obj_rv(v)
}
