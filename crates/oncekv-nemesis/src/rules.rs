//! The nftables text for every network fault, as pure functions of member indices (the
//! [`crate::firewall`] applies it). Nothing here runs a command.
//!
//! Why connections are labelled instead of matched by address: on `lo`, a connection
//! from member A (bound to 127.0.0.1) to member B's peer port 127.0.0.2:2380 does not
//! leave from A's address. Neither oncekv nor etcd binds the source of its outgoing peer
//! connections, and the kernel's local route gives every such connection the source
//! 127.0.0.1, whoever made it. So `ip saddr` cannot tell members apart. Each member runs
//! under a uid of its own instead ([`member_uid`]), and the first packet of each
//! connection to a peer port is matched on its owner's uid (`meta skuid`) and its
//! destination address, and the connection marked with the ordered pair (`ct mark`,
//! [`pair_mark`]). conntrack keeps the mark for every later packet of the connection in
//! both directions, so a fault rule names a pair by its mark: it drops (or thins out) the
//! requests and the replies of exactly the connections between those two members, and
//! nothing on the client port (2379), where each client keeps reaching its own member,
//! as in Jepsen.

use std::fmt::Write;

/// The table the harness creates and deletes (nothing else in the namespace is touched).
pub const TABLE: &str = "oncekv_nemesis";
/// Every member's peer port (each member has an address of its own).
pub const PEER_PORT: u16 = 2380;
/// Every member's client port.
pub const CLIENT_PORT: u16 = 2379;
/// Member `i`'s relay for connections from member `j` listens on member `i`'s address,
/// port `RELAY_BASE + j` (see [`crate::relay`]).
pub const RELAY_BASE: u16 = 2390;

/// Member `i`'s address (0-based: member 0 is 127.0.0.1).
pub fn member_addr(i: usize) -> String {
    format!("127.0.0.{}", i + 1)
}

/// The uid member `i` runs as (no account needs to exist for it).
pub fn member_uid(i: usize) -> u32 {
    40_001 + i as u32
}

/// The connection mark of connections from member `from` to member `to`'s peer port.
pub fn pair_mark(from: usize, to: usize) -> u32 {
    (((from + 1) as u32) << 8) | (to + 1) as u32
}

/// An unordered link between two members.
pub type Link = (usize, usize);

/// Every `(from, to)` of a cluster of `n` members, both ways.
pub fn ordered_pairs(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).flat_map(move |from| {
        (0..n)
            .filter(move |&to| to != from)
            .map(move |to| (from, to))
    })
}

/// Every link of a cluster of `n` members.
pub fn all_links(n: usize) -> Vec<Link> {
    (0..n)
        .flat_map(|a| ((a + 1)..n).map(move |b| (a, b)))
        .collect()
}

/// The links that cross between `side` and the other members of `n`.
pub fn links_across(n: usize, side: &[usize]) -> Vec<Link> {
    all_links(n)
        .into_iter()
        .filter(|(a, b)| side.contains(a) != side.contains(b))
        .collect()
}

fn marks(links: &[Link]) -> String {
    let mut out = String::new();
    for (i, (a, b)) in links.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(
            out,
            "{:#06x}, {:#06x}",
            pair_mark(*a, *b),
            pair_mark(*b, *a)
        );
    }
    out
}

/// The table as the harness creates it for `n` members: the labelling rules, a NAT chain
/// that sends every member-to-member connection through its relay when `relays`, and an
/// empty chain for the faults. Loaded with `nft -f -` in one transaction.
pub fn table(n: usize, relays: bool) -> String {
    let mut s = format!("table inet {TABLE} {{\n");
    // Priority -150: after conntrack has made the connection's entry (-200), before NAT
    // (-100) rewrites the destination, so the label names the member meant.
    s.push_str("  chain label {\n    type filter hook output priority -150; policy accept;\n");
    for (from, to) in ordered_pairs(n) {
        let _ = writeln!(
            s,
            "    ct state new tcp dport {PEER_PORT} meta skuid {} ip daddr {} ct mark set {:#06x}",
            member_uid(from),
            member_addr(to),
            pair_mark(from, to)
        );
    }
    s.push_str("  }\n  chain nat {\n    type nat hook output priority -100; policy accept;\n");
    for (from, to) in ordered_pairs(n).filter(|_| relays) {
        let _ = writeln!(
            s,
            "    ct mark {:#06x} tcp dport {PEER_PORT} dnat ip to {}:{}",
            pair_mark(from, to),
            member_addr(to),
            RELAY_BASE + from as u16
        );
    }
    s.push_str(
        "  }\n  chain faults {\n    type filter hook output priority 0; policy accept;\n  }\n}\n",
    );
    s
}

/// Cuts `links` both ways: every packet of a connection between the two members is
/// dropped, requests and replies (established connections stall, new ones never
/// connect; when the rule goes, TCP's retransmissions carry on).
pub fn cut(links: &[Link]) -> Option<String> {
    (!links.is_empty()).then(|| {
        format!(
            "add rule inet {TABLE} faults ct mark {{ {} }} drop\n",
            marks(links)
        )
    })
}

/// Drops `percent` % of the packets on `links`, both ways, at random (nft's `numgen`).
pub fn loss(links: &[Link], percent: u32) -> Option<String> {
    (!links.is_empty() && percent > 0).then(|| {
        format!(
            "add rule inet {TABLE} faults ct mark {{ {} }} numgen random mod 100 < {} drop\n",
            marks(links),
            percent.min(100)
        )
    })
}

/// Drops every packet member `i` sends from its client port: the answers to its clients
/// (their requests still arrive and run).
pub fn lose_replies(i: usize) -> String {
    format!(
        "add rule inet {TABLE} faults ip saddr {} tcp sport {CLIENT_PORT} drop\n",
        member_addr(i)
    )
}

/// Removes every fault (the labels and relays stay).
pub fn heal() -> String {
    format!("flush chain inet {TABLE} faults\n")
}

/// Deletes the table.
pub fn delete() -> String {
    format!("delete table inet {TABLE}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    // The label must name the sender by uid and the receiver by address: a rule keyed on
    // the source address would match every member (they all connect from 127.0.0.1).
    #[test]
    fn the_label_of_a_pair_names_the_senders_uid_and_the_receivers_address() {
        let t = table(3, false);
        assert!(t.contains(
            "ct state new tcp dport 2380 meta skuid 40001 ip daddr 127.0.0.2 ct mark set 0x0102"
        ));
        assert!(t.contains("meta skuid 40002 ip daddr 127.0.0.1 ct mark set 0x0201"));
        assert!(!t.contains("saddr"), "{t}");
        assert!(!t.contains("ip daddr 127.0.0.1 ct mark set 0x0101"));
        assert_eq!(t.matches("ct mark set").count(), 6);
        assert!(!t.contains("dnat"));
    }

    // With relays, each pair's connections go to the receiver's relay port for that sender.
    #[test]
    fn relays_redirect_each_pair_to_its_own_port_on_the_receiver() {
        let t = table(3, true);
        assert!(t.contains("ct mark 0x0301 tcp dport 2380 dnat ip to 127.0.0.1:2392"));
        assert!(t.contains("ct mark 0x0102 tcp dport 2380 dnat ip to 127.0.0.2:2390"));
        assert_eq!(t.matches("dnat").count(), 6);
    }

    // A cut must drop both directions of both members' connections, and only theirs.
    #[test]
    fn a_partition_of_the_leader_cuts_its_links_both_ways_and_no_other() {
        let links = links_across(3, &[1]);
        assert_eq!(links, vec![(0, 1), (1, 2)]);
        let rule = cut(&links).unwrap_or_default();
        assert_eq!(
            rule,
            "add rule inet oncekv_nemesis faults ct mark { 0x0102, 0x0201, 0x0203, 0x0302 } drop\n"
        );
        assert!(!rule.contains("0x0103") && !rule.contains("0x0301"));
        assert_eq!(cut(&[]), None);
    }

    // A bridge: the two sides lose each other, the middle member keeps both.
    #[test]
    fn a_bridge_keeps_the_middle_member_linked_to_both_sides() {
        let side_a = [0, 1];
        let side_b = [3, 4];
        let links: Vec<Link> = all_links(5)
            .into_iter()
            .filter(|(a, b)| {
                (side_a.contains(a) && side_b.contains(b))
                    || (side_b.contains(a) && side_a.contains(b))
            })
            .collect();
        assert_eq!(links.len(), 4);
        assert!(links.iter().all(|(a, b)| *a != 2 && *b != 2));
    }

    #[test]
    fn loss_is_a_share_of_the_pairs_packets() {
        assert_eq!(
            loss(&[(0, 2)], 7).unwrap_or_default(),
            "add rule inet oncekv_nemesis faults ct mark { 0x0103, 0x0301 } numgen random mod 100 < 7 drop\n"
        );
        assert_eq!(loss(&[(0, 2)], 0), None);
    }

    #[test]
    fn lost_replies_are_the_members_client_port_answers_only() {
        let rule = lose_replies(1);
        assert!(
            rule.contains("ip saddr 127.0.0.2 tcp sport 2379 drop"),
            "{rule}"
        );
        assert!(!rule.contains("2380"), "{rule}");
    }
}
