// A team reduction inside an expression: it is a `let`'s value, where a barrier may stand.
#[offload::kernel(teams = 64)]
fn k(team: usize, thread: usize, x: &[f32], y: &mut [f32]) {
    y[team * 64 + thread] = x[team * 64 + thread] / offload::team_sum(x[team * 64 + thread]);
}

fn main() {}
