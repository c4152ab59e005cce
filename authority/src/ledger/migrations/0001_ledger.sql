-- podca ledger schema 1: one row per decision (issued, denied, failed). `record` is the whole
-- LedgerRecord (JSON schema 1); the columns beside it are its indexed fields.
create table podca_ledger (
    seq bigserial primary key,
    id text not null unique,
    serial text unique,
    time timestamptz not null,
    source text not null,
    signer text not null,
    outcome text not null,
    reason text not null,
    identity text not null,
    namespace text not null,
    service_account text not null,
    pod_name text,
    node_name text,
    cert_sha256 text,
    spki_sha256 text,
    issuer_fingerprint text,
    replica text not null,
    record jsonb not null
);
create index podca_ledger_time on podca_ledger (time);
create index podca_ledger_identity_time on podca_ledger (identity, time);
create index podca_ledger_namespace_time on podca_ledger (namespace, time);
create index podca_ledger_node_time on podca_ledger (node_name, time);
create index podca_ledger_cert_sha256 on podca_ledger (cert_sha256);
