-- podca ledger schema 2: the Merkle log over the records (docs/ledger-log.md). One leaf per
-- record, in the order the records were committed; the single podca_log_state row is the
-- sequencer: every append locks it (for update) before it takes sequence numbers, so replicas
-- appending together make one linear log.
create table podca_log_leaves (
    idx bigint primary key,
    seq bigint not null unique,
    hash bytea not null
);
create table podca_log_state (
    id integer primary key check (id = 1),
    frontier bytea not null
);
insert into podca_log_state (id, frontier) values (1, ''::bytea);
-- Signed checkpoints (C2SP tlog-checkpoint notes), by tree size.
create table podca_log_checkpoints (
    size bigint primary key,
    note text not null,
    created_at timestamptz not null default now()
);
-- Records retention pruned: their leaves stay, their rows are gone on purpose.
create table podca_log_pruned (seq bigint primary key);
