// A barrier in a loop whose bound is a `let mut` local set from the thread's index: some
// threads would skip barriers the others wait at. The error names the local and why.
#[offload::kernel(teams = 64)]
fn k(team: usize, thread: usize, y: &mut [f32]) {
    let mut k = thread;
    while k < 64 {
        offload::barrier();
        k += 32;
    }
    y[team * 64 + thread] = 1.0;
}

fn main() {}
