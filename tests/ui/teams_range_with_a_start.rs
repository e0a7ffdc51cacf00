// A team size given at launch is written `teams = ..=MAX`: a range with a start is refused.
#[offload::kernel(teams = 32..=256)]
fn k(team: usize, thread: usize, y: &mut [f32]) {
    y[team * offload::team_size() + thread] = 1.0;
}

fn main() {}
