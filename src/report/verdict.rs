//! The verdict every report opens with: did isolation hold, from a run's rows and its breach
//! tokens. Pure: rows in, one [`Verdict`] out; owns the rule and the sentence, never counts.

use super::{Isolation, Row, Verdict};

/// Tokens past isolation points, summed over a run (the model's attribution).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BreachTokens {
    /// Served from blocks another session put there, past the isolation point.
    pub cross_session: u64,
    /// Served to profiling requests from blocks warmup put there, past the isolation point.
    pub warmup_reuse: u64,
}

/// The verdict of a run whose rows are `rows`.
pub fn judge(rows: &[Row], tokens: BreachTokens) -> Verdict {
    if rows.is_empty() {
        return Verdict {
            message: "No request in this run yet.".into(),
            ..Verdict::default()
        };
    }
    let isolating: Vec<&Row> = rows.iter().filter(|r| r.target != "none").collect();
    if isolating.is_empty() {
        return not_requested(rows);
    }
    let accounted: u64 = isolating.iter().map(|r| r.accounted_requests).sum();
    let requests: u64 = isolating.iter().map(|r| r.requests).sum();
    let collisions: u64 = isolating.iter().map(|r| r.breaches.session_collision).sum();
    let targets = names(isolating.iter().map(|r| r.target.as_str()));
    let mut v = Verdict {
        reused_from_warmup_tokens: tokens.warmup_reuse,
        cross_session_tokens: tokens.cross_session,
        ..Verdict::default()
    };
    let salt_ignored: u64 = isolating.iter().map(|r| r.salt_ignored).sum();
    if salt_ignored > 0 {
        v.isolation = Isolation::Breached;
        v.message = format!(
            "Isolation cannot be trusted ({targets}): the upstream reported more cached tokens \
             than cache_salt allows on {salt_ignored} requests, so it seems to ignore the salt. \
             Fix: check with `kvbust probe`, or use cache_bust.method = marker."
        );
        return v;
    }
    if tokens.warmup_reuse == 0 && tokens.cross_session == 0 && collisions == 0 {
        v.isolation = Isolation::Held;
        v.message = if accounted == 0 {
            format!(
                "Isolation requested ({targets}) but not checked: the cache model accounted none \
                 of {requests} requests (see cache_model.unaccounted)."
            )
        } else {
            format!(
                "Isolation held: 0 tokens reused from warmup past the isolation point and 0 \
                 across sessions ({accounted} of {requests} requests checked, {targets})."
            )
        };
        return v;
    }
    v.isolation = Isolation::Breached;
    let mut parts = Vec::new();
    let mut fixes = Vec::new();
    if tokens.warmup_reuse > 0 {
        parts.push(format!(
            "{} profiling prompt tokens reused warmup's cache past the isolation point",
            tokens.warmup_reuse
        ));
        fixes.push(
            "mark warmup requests as warmup (x-kvbust-phase, or the run's warmup_requests: \
             kvbust run --warmup-requests N)",
        );
    }
    if tokens.cross_session > 0 {
        parts.push(format!(
            "{} prompt tokens were served across sessions",
            tokens.cross_session
        ));
        fixes.push("give every conversation its own session key (x-correlation-id)");
    }
    if collisions > 0 {
        parts.push(format!(
            "{collisions} requests carried another live conversation's session key"
        ));
        fixes.push("send a distinct x-correlation-id per conversation");
    }
    v.message = format!(
        "Isolation breached ({targets}): {}. Fix: {}.",
        parts.join("; "),
        fixes.join("; ")
    );
    v
}

fn not_requested(rows: &[Row]) -> Verdict {
    let profiling: Vec<&Row> = rows.iter().filter(|r| r.phase == "profiling").collect();
    let (warm, prompt) = profiling.iter().fold((0, 0), |(w, p), r| {
        (w + r.reuse.warmup, p + r.prompt_tokens.predicted)
    });
    let share = (prompt > 0).then(|| warm as f64 / prompt as f64);
    // Every profiling request under the dial: warmup's cache serving them is what the dial
    // asked for (a dial sweep warms once and profiles at several ratios), not a mistake to fix.
    let requests: u64 = profiling.iter().map(|r| r.requests).sum();
    let dialled: u64 = profiling
        .iter()
        .filter(|r| r.dial().is_some())
        .map(|r| r.dialled_requests)
        .sum();
    // As the dial is set (`0.5`), each once.
    let mut dials: Vec<String> = Vec::new();
    for d in profiling.iter().filter_map(|r| r.dial()) {
        let text = format!("{:.3}", d + 0.0);
        let text = text.trim_end_matches('0').trim_end_matches('.').to_string();
        if !dials.contains(&text) {
            dials.push(text);
        }
    }
    let dials = dials.join(", ");
    let message = match share {
        Some(s) if warm > 0 && requests > 0 && dialled == requests => format!(
            "Isolation not requested (target none): {:.1}% of profiling prompt tokens ({warm} of \
             {prompt}) were served from warmup's cache, as the dial (hit_ratio {dials}) allows.",
            s * 100.0
        ),
        Some(s) if warm > 0 => format!(
            "Isolation not requested (target none): {:.1}% of profiling prompt tokens ({warm} of \
             {prompt}) were served from warmup's cache. Set a cache-bust target to isolate.",
            s * 100.0
        ),
        Some(_) => "Isolation not requested (target none): no profiling prompt token was served \
                    from warmup's cache."
            .to_string(),
        None => "Isolation not requested (target none).".to_string(),
    };
    Verdict {
        isolation: Isolation::NotRequested,
        reused_from_warmup_tokens: warm,
        cross_session_tokens: 0,
        warmup_share: share,
        message,
    }
}

fn names<'a>(targets: impl Iterator<Item = &'a str>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for t in targets {
        if !seen.contains(&t) {
            seen.push(t);
        }
    }
    seen.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Breaches, Pair, Reuse};

    fn row(phase: &str, target: &str, accounted: u64, prompt: u64, warm: u64) -> Row {
        Row {
            phase: phase.into(),
            target: target.into(),
            requests: accounted,
            accounted_requests: accounted,
            prompt_tokens: Pair {
                reported: None,
                predicted: prompt,
            },
            reuse: Reuse {
                warmup: warm,
                ..Reuse::default()
            },
            ..Row::default()
        }
    }

    #[test]
    #[allow(clippy::too_many_lines)] // a table of cases
    fn the_verdict_follows_the_rule() {
        let t = |c, w| BreachTokens {
            cross_session: c,
            warmup_reuse: w,
        };
        let none = [
            row("warmup", "none", 4, 400, 0),
            row("profiling", "none", 10, 1000, 970),
        ];
        let held = [row("profiling", "first_turn_prefix", 10, 1000, 0)];
        let mut collided = held.clone();
        collided[0].breaches = Breaches {
            session_collision: 2,
            ..Breaches::default()
        };
        let unchecked = [row("profiling", "system_prefix", 0, 0, 0)];
        let mut ignored = held.clone();
        ignored[0].salt_ignored = 3;
        // A dial sweep's run: every profiling request dialled, warmup's cache serving them.
        let mut dialled = none.clone();
        dialled[1].hit_ratio = Some(0.5);
        dialled[1].dialled_requests = 10;
        let mut half_dialled = dialled.clone();
        half_dialled[1].dialled_requests = 5;
        // (rows, tokens, isolation, warmup_share, words the sentence must hold)
        type Case<'a> = (
            &'a [Row],
            BreachTokens,
            Isolation,
            Option<f64>,
            &'a [&'a str],
        );
        let cases: Vec<Case> = vec![
            (
                &none,
                t(0, 0),
                Isolation::NotRequested,
                Some(0.97),
                &["97.0%", "970 of 1000"],
            ),
            (
                &dialled,
                t(0, 0),
                Isolation::NotRequested,
                Some(0.97),
                &["97.0%", "as the dial (hit_ratio 0.5) allows"],
            ),
            (
                &half_dialled,
                t(0, 0),
                Isolation::NotRequested,
                Some(0.97),
                &["97.0%", "Set a cache-bust target"],
            ),
            (
                &none[..1],
                t(0, 0),
                Isolation::NotRequested,
                None,
                &["not requested"],
            ),
            (
                &held,
                t(0, 0),
                Isolation::Held,
                None,
                &["held", "10 of 10", "first_turn_prefix"],
            ),
            (
                &held,
                t(0, 48),
                Isolation::Breached,
                None,
                &["48 profiling", "x-kvbust-phase"],
            ),
            (
                &held,
                t(32, 0),
                Isolation::Breached,
                None,
                &["32 prompt tokens", "x-correlation-id"],
            ),
            (
                &collided,
                t(0, 0),
                Isolation::Breached,
                None,
                &["2 requests", "distinct"],
            ),
            (&unchecked, t(0, 0), Isolation::Held, None, &["not checked"]),
            (&[], t(0, 0), Isolation::NotRequested, None, &["No request"]),
            (
                &ignored,
                t(0, 0),
                Isolation::Breached,
                None,
                &["cannot be trusted", "3 requests", "kvbust probe"],
            ),
        ];
        for (rows, tokens, isolation, share, words) in cases {
            let v = judge(rows, tokens);
            assert_eq!(v.isolation, isolation, "{}", v.message);
            assert_eq!(v.warmup_share, share, "{}", v.message);
            for w in words {
                assert!(v.message.contains(w), "{w:?} in {:?}", v.message);
            }
        }
    }
}
