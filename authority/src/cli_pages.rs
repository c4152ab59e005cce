//! The man pages' own sections — ENVIRONMENT, FILES and EXAMPLES — of `podca` and each of its
//! subcommands, as data, and their roff. `podca completions --man` renders the rest (NAME,
//! SYNOPSIS, DESCRIPTION, OPTIONS) from the command-line definitions and appends these; a
//! subcommand without a [`Page`] here is an error there, so a new one cannot ship without
//! examples.

use std::fmt::Write as _;

/// One page's own sections.
#[derive(Debug)]
pub struct Page {
    /// The subcommand after `podca`: `""` for podca(1), `"ca init"` for podca-ca-init(1).
    pub command: &'static str,
    /// What an example does, then its command line.
    pub examples: &'static [(&'static str, &'static str)],
    /// Variables read besides the flags' own (which [`sections`] is given).
    pub environment: &'static [(&'static str, &'static str)],
    /// Paths read or written, and what they hold.
    pub files: &'static [(&'static str, &'static str)],
}

/// The page of `command` (`"ca init"`), if it has one.
pub fn page(command: &str) -> Option<&'static Page> {
    PAGES.iter().find(|p| p.command == command)
}

/// The ENVIRONMENT, FILES and EXAMPLES sections of `page` in roff. `flag_env` are the variables
/// the command's flags read, with the flag: (`PODCA_DATA_DIR`, `dir`).
pub fn sections(page: &Page, flag_env: &[(String, String)]) -> String {
    // In the order of man-pages(7).
    let mut roff = String::from(".SH ENVIRONMENT\n");
    let flags = flag_env
        .iter()
        .map(|(var, flag)| (var.as_str(), format!("The default of --{flag}.")));
    let others = page
        .environment
        .iter()
        .chain(COMMON_ENVIRONMENT)
        .map(|&(var, what)| (var, what.to_owned()));
    for (var, what) in flags.chain(others) {
        let _ = write!(roff, ".TP\n.B {}\n{}\n", text(var), text(&what));
    }
    roff.push_str(".SH FILES\n");
    if page.files.is_empty() {
        roff.push_str(".PP\nNone: it reads and writes only what its options name.\n");
    }
    for (path, what) in page.files {
        let _ = write!(roff, ".TP\n.I {}\n{}\n", text(path), text(what));
    }
    roff.push_str(".SH EXAMPLES\n");
    for (what, line) in page.examples {
        let _ = write!(
            roff,
            ".PP\n{}\n.RS 4\n.nf\n{}\n.fi\n.RE\n",
            text(what),
            text(line)
        );
    }
    roff
}

/// The examples as `--help` shows them after the options.
pub fn examples_help(command: &str) -> String {
    let lines = page(command).map_or(&[][..], |p| p.examples);
    lines
        .iter()
        .fold("Examples:".to_owned(), |mut out, (_, line)| {
            let _ = write!(out, "\n  {line}");
            out
        })
}

/// Text as roff prints it: a backslash is printed, not an escape; hyphens are minus signs, so
/// that a command or flag copied from the rendered page runs; no line reads as a request.
fn text(s: &str) -> String {
    let escaped = s.replace('\\', "\\e").replace('-', "\\-");
    match escaped.starts_with(['.', '\'']) {
        true => format!("\\&{escaped}"),
        false => escaped,
    }
}

const COMMON_ENVIRONMENT: &[(&str, &str)] = &[(
    "NO_COLOR",
    "When set (to anything), text log lines carry no colour, even on a terminal.",
)];

const DATA_DIR_ENVIRONMENT: &[(&str, &str)] = &[
    (
        "XDG_DATA_HOME",
        "Without --dir or PODCA_DATA_DIR, the data directory is $XDG_DATA_HOME/podca.",
    ),
    (
        "HOME",
        "Without those, the data directory is ~/.local/share/podca.",
    ),
];

const KUBE_ENVIRONMENT: &[(&str, &str)] = &[(
    "KUBECONFIG",
    "The kubeconfig files, when --kubeconfig is not given; else ~/.kube/config, else the \
     in-cluster service account.",
)];

const DATA_DIR_FILES: &[(&str, &str)] = &[
    (
        "~/.local/share/podca/",
        "The default data directory (see ENVIRONMENT).",
    ),
    (
        "<dir>/root.pem",
        "The published trust anchors: every root a verifier needs now.",
    ),
    ("<dir>/state.json", "The CA generations and their phases."),
    (
        "<dir>/generations/<n>/",
        "Generation n: root.pem, issuing.pem (the chain), and their keys root.key and \
         issuing.key (PKCS#8, mode 0600).",
    ),
    (
        "<dir>/ledger.redb",
        "The issuance ledger (one process at a time).",
    ),
    ("<dir>/lock", "The writers' lock."),
];

const LEDGER_FILES: &[(&str, &str)] = &[
    (
        "<dir>/ledger.redb",
        "The ledger, unless --config names another or --postgres-url-file a PostgreSQL one.",
    ),
    (
        "<dir>/log.key",
        "The Merkle log's Ed25519 key, unless [ledger.log] key_file names another.",
    ),
    ("~/.local/share/podca/", "The default data directory."),
];

const CONFIG_FILE: (&str, &str) = (
    "podca.toml",
    "The configuration --config names (any path; docs/reference.md lists its keys).",
);

const PAGES: &[Page] = &[
    Page {
        command: "",
        examples: &[
            ("Try podca on a laptop, no cluster needed:", "podca dev"),
            (
                "Create a CA and issue a credential bundle with it:",
                "podca ca init && podca issue -n default --service-account web -o bundle.pem",
            ),
            ("Decode and check the bundle:", "podca inspect bundle.pem"),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: DATA_DIR_FILES,
    },
    Page {
        command: "ca",
        examples: &[
            (
                "Create a CA in the default data directory:",
                "podca ca init",
            ),
            ("Show its generations:", "podca ca show"),
            ("Start a rotation:", "podca ca rotate"),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: DATA_DIR_FILES,
    },
    Page {
        command: "ca init",
        examples: &[
            ("Create a CA in ./ca:", "podca ca init --dir ca"),
            (
                "A post-quantum CA:",
                "podca ca init --dir ca --algorithm ml-dsa-65",
            ),
            (
                "Import an existing CA:",
                "podca ca init --import-cert ca.pem --import-key ca.key",
            ),
            (
                "Keep the key in an HSM, generated there:",
                "podca ca init --pkcs11-uri 'pkcs11:token=podca;object=podca-ca' \
                 --pkcs11-generate --pkcs11-pin-file pin.txt",
            ),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: DATA_DIR_FILES,
    },
    Page {
        command: "ca show",
        examples: &[
            ("The generations of ./ca:", "podca ca show --dir ca"),
            (
                "A Secret-held CA, and fail unless its history seal verifies:",
                "podca ca show --secret podca-system/podca-ca --check",
            ),
        ],
        environment: &[
            DATA_DIR_ENVIRONMENT[0],
            DATA_DIR_ENVIRONMENT[1],
            KUBE_ENVIRONMENT[0],
        ],
        files: DATA_DIR_FILES,
    },
    Page {
        command: "ca rotate",
        examples: &[
            ("Prepare the next CA now:", "podca ca rotate --dir ca"),
            (
                "Apply only what the schedule has due (from cron):",
                "podca ca rotate --dir ca --scheduled-only",
            ),
            (
                "Migrate to a post-quantum CA:",
                "podca ca rotate --dir ca --algorithm ml-dsa-65",
            ),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: DATA_DIR_FILES,
    },
    Page {
        command: "issue",
        examples: &[
            (
                "A credential bundle (key, then chain) from the local CA:",
                "podca issue -n shop --service-account web --key-type ECDSAP256 -o bundle.pem",
            ),
            (
                "Certify a CSR's key through a running podca dev:",
                "podca issue --server http://127.0.0.1:8443 --csr req.csr > chain.pem",
            ),
            (
                "From podca serve, with a service-account token:",
                "podca issue --server https://podca.podca-system.svc:8443 --ca-file roots.pem \
                 --token-file token -o bundle.pem",
            ),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: DATA_DIR_FILES,
    },
    Page {
        command: "bundle",
        examples: &[
            ("The trust anchors, PEM:", "podca bundle > roots.pem"),
            ("The SPIFFE bundle document:", "podca bundle --spiffe"),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: &[
            ("<dir>/root.pem", "The trust anchors it prints."),
            DATA_DIR_FILES[0],
        ],
    },
    Page {
        command: "inspect",
        examples: &[
            (
                "Decode a bundle and check it against the local CA:",
                "podca inspect bundle.pem",
            ),
            (
                "Check a chain against given anchors:",
                "podca inspect chain.pem --ca-file roots.pem",
            ),
            (
                "Validate a JWT-SVID:",
                "podca inspect token.jwt --jwks bundle.json --audience api",
            ),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: &[
            (
                "<dir>/root.pem",
                "The anchors a chain is checked against when --ca-file is not given.",
            ),
            (
                "<dir>/jwt/",
                "The JWT keys a token is checked against without --jwks.",
            ),
            DATA_DIR_FILES[0],
        ],
    },
    Page {
        command: "ledger",
        examples: &[
            ("The latest decisions:", "podca ledger list"),
            (
                "Every denial, as JSON lines:",
                "podca ledger export --outcome denied",
            ),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: LEDGER_FILES,
    },
    Page {
        command: "ledger list",
        examples: &[
            (
                "Denials in a namespace since a time:",
                "podca ledger list --namespace shop --outcome denied --since 2026-01-01T00:00:00Z",
            ),
            (
                "From the PostgreSQL ledger of a config:",
                "podca ledger list --config podca.toml --json",
            ),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: LEDGER_FILES,
    },
    Page {
        command: "ledger show",
        examples: &[(
            "One certificate's record:",
            "podca ledger show 41a24fef678e5c22a8e9138b9c2ba8ff",
        )],
        environment: DATA_DIR_ENVIRONMENT,
        files: LEDGER_FILES,
    },
    Page {
        command: "ledger export",
        examples: &[(
            "Everything issued in a namespace, for a SIEM:",
            "podca ledger export --namespace shop --outcome issued > shop.jsonl",
        )],
        environment: DATA_DIR_ENVIRONMENT,
        files: LEDGER_FILES,
    },
    Page {
        command: "ledger prune",
        examples: &[(
            "Delete the records of before 2026:",
            "podca ledger prune --before 2026-01-01T00:00:00Z",
        )],
        environment: DATA_DIR_ENVIRONMENT,
        files: LEDGER_FILES,
    },
    Page {
        command: "ledger checkpoint",
        examples: &[("Sign a checkpoint now:", "podca ledger checkpoint --dir ca")],
        environment: DATA_DIR_ENVIRONMENT,
        files: LEDGER_FILES,
    },
    Page {
        command: "ledger prove",
        examples: &[(
            "Prove a certificate's record is in the log:",
            "podca ledger prove --serial 41a24fef678e5c22a8e9138b9c2ba8ff > proof.json",
        )],
        environment: DATA_DIR_ENVIRONMENT,
        files: LEDGER_FILES,
    },
    Page {
        command: "ledger consistency",
        examples: &[(
            "Prove the log of 100 leaves grew into today's:",
            "podca ledger consistency --from 100",
        )],
        environment: DATA_DIR_ENVIRONMENT,
        files: LEDGER_FILES,
    },
    Page {
        command: "ledger verify",
        examples: &[
            ("Check the whole log:", "podca ledger verify --dir ca"),
            (
                "With the published verifier key instead of the key file:",
                "podca ledger verify --verifier \"$(cat verifier.txt)\"",
            ),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: LEDGER_FILES,
    },
    Page {
        command: "serve",
        examples: &[
            (
                "In a cluster:",
                "podca serve --config /etc/podca/podca.toml",
            ),
            (
                "Several replicas, each signing its share:",
                "podca serve --config /etc/podca/podca.toml --leader-elect --sharding rendezvous",
            ),
        ],
        environment: &[
            KUBE_ENVIRONMENT[0],
            (
                "POD_NAME",
                "The Lease identity's prefix when --lease-identity is not given.",
            ),
        ],
        files: &[
            CONFIG_FILE,
            (
                "/var/run/secrets/kubernetes.io/serviceaccount/",
                "The in-cluster service account's token and CA, without a kubeconfig.",
            ),
        ],
    },
    Page {
        command: "dev",
        examples: &[
            ("Start it:", "podca dev"),
            (
                "Map other local users to identities, and keep a bundle on disk:",
                "podca dev --config dev.toml --bundle shop/web",
            ),
            (
                "A SPIFFE client against it:",
                "SPIFFE_ENDPOINT_SOCKET=unix://$HOME/.local/share/podca/workload.sock my-client",
            ),
        ],
        environment: DATA_DIR_ENVIRONMENT,
        files: &[
            DATA_DIR_FILES[0],
            (
                "<data-dir>/workload.sock",
                "The SPIFFE Workload API socket (mode 0600 unless [dev] identities maps another \
                 user).",
            ),
            DATA_DIR_FILES[1],
            DATA_DIR_FILES[4],
            CONFIG_FILE,
        ],
    },
    Page {
        command: "doctor",
        examples: &[
            ("Preflight the current kubeconfig context:", "podca doctor"),
            (
                "As podca's own service account, with its config:",
                "podca doctor --as system:serviceaccount:podca-system:podca --config podca.toml",
            ),
        ],
        environment: &[
            KUBE_ENVIRONMENT[0],
            (
                "POD_NAMESPACE",
                "The leader Lease's namespace when --lease-namespace is not given.",
            ),
        ],
        files: &[CONFIG_FILE, ("~/.kube/config", "The default kubeconfig.")],
    },
    Page {
        command: "policy",
        examples: &[
            (
                "Check every signer's policy:",
                "podca policy lint --config podca.toml",
            ),
            (
                "Decide a sample request:",
                "podca policy test --config podca.toml --request pcr.yaml",
            ),
        ],
        environment: &[],
        files: &[CONFIG_FILE],
    },
    Page {
        command: "policy test",
        examples: &[
            (
                "Decide a PodCertificateRequest from the cluster:",
                "podca policy test --config podca.toml --request pcr.yaml",
            ),
            (
                "A gRPC request description, with namespace labels, as JSON:",
                "podca policy test --config podca.toml --request grpc.yaml \
                 --namespace-labels namespaces.yaml -o json",
            ),
        ],
        environment: &[],
        files: &[CONFIG_FILE],
    },
    Page {
        command: "policy lint",
        examples: &[
            (
                "Lint before deploying:",
                "podca policy lint --config podca.toml",
            ),
            (
                "For CI tooling:",
                "podca policy lint --config podca.toml -o json",
            ),
        ],
        environment: &[],
        files: &[CONFIG_FILE],
    },
    Page {
        command: "federation",
        examples: &[(
            "Each foreign trust domain's bundle:",
            "podca federation status --config podca.toml",
        )],
        environment: &[],
        files: &[CONFIG_FILE],
    },
    Page {
        command: "federation status",
        examples: &[
            (
                "Each foreign trust domain's bundle:",
                "podca federation status --config podca.toml",
            ),
            (
                "Those podca dev keeps:",
                "podca federation status --config dev.toml --data-dir ~/.local/share/podca",
            ),
        ],
        environment: &[],
        files: &[CONFIG_FILE],
    },
    Page {
        command: "renewal",
        examples: &[
            (
                "Stop a certificate from renewing:",
                "podca renewal --denylist denylist.toml --deny-serial 41a24fef678e5c22a8e9138b9c2ba8ff",
            ),
            (
                "Allow an identity again:",
                "podca renewal --denylist denylist.toml --allow-identity \
                 spiffe://cluster.local/ns/shop/sa/web",
            ),
        ],
        environment: &[],
        files: &[(
            "denylist.toml",
            "The file [grpc] renewal_denylist names; podca serve reloads it on change.",
        )],
    },
    Page {
        command: "token-signer",
        examples: &[(
            "Serve kube-apiserver's --service-account-signing-endpoint:",
            "podca token-signer --config podca.toml --socket /run/podca/token-signer.sock",
        )],
        environment: &[],
        files: &[
            CONFIG_FILE,
            (
                "<dir>/jwt/",
                "The signing keys, in the [ca] dir the config names.",
            ),
        ],
    },
    Page {
        command: "completions",
        examples: &[
            (
                "Bash:",
                "podca completions bash > /etc/bash_completion.d/podca",
            ),
            ("Zsh:", "podca completions zsh > \"${fpath[1]}/_podca\""),
            (
                "Fish:",
                "podca completions fish > ~/.config/fish/completions/podca.fish",
            ),
            (
                "Every man page:",
                "podca completions --man --out-dir /usr/local/share/man/man1",
            ),
            (
                "Only podca(1), to standard output:",
                "podca completions --man > podca.1",
            ),
        ],
        environment: &[],
        files: &[],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_runs_its_own_command() {
        for page in PAGES {
            let own = format!("podca {}", page.command);
            assert!(
                page.examples
                    .iter()
                    .any(|(_, line)| line.contains(own.trim_end())),
                "podca {}: no example runs it",
                page.command
            );
        }
    }

    #[test]
    fn roff_escapes_what_would_be_markup() {
        assert_eq!(text(".hidden request"), "\\&.hidden request");
        assert_eq!(text("'quote"), "\\&'quote");
        assert_eq!(text("a\\b"), "a\\eb");
        assert_eq!(text("--dir a-b"), "\\-\\-dir a\\-b");
    }

    #[test]
    fn sections_name_the_flag_variables_and_the_page_own() {
        let ca_init = page("ca init").expect("a page");
        let roff = sections(ca_init, &[("PODCA_DATA_DIR".into(), "dir".into())]);
        for part in [
            ".SH EXAMPLES\n",
            "podca ca init \\-\\-dir ca\n",
            ".SH ENVIRONMENT\n.TP\n.B PODCA_DATA_DIR\nThe default of \\-\\-dir.\n",
            ".B XDG_DATA_HOME\n",
            ".B NO_COLOR\n",
            ".SH FILES\n",
            ".I <dir>/root.pem\n",
        ] {
            assert!(roff.contains(part), "{part:?} missing in:\n{roff}");
        }
        let none = sections(page("completions").expect("a page"), &[]);
        assert!(none.contains(".SH FILES\n.PP\nNone"), "{none}");
    }

    #[test]
    fn help_examples_are_the_page_examples() {
        let help = examples_help("completions");
        assert!(
            help.starts_with("Examples:\n  podca completions bash"),
            "{help}"
        );
        assert_eq!(help.lines().count(), 6, "{help}");
    }
}
